"""Moving images between engines and registries: pull, push, inspect, digest resolution, and the one function
that runs an engine argv."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.images import lock_entry, split_reference
from draftscope.ops.images.build import check_engine
from draftscope.ops.images.lockfile import _DIGEST, Runner

# --- references, inspect --------------------------------------------------------------------------------------

# The distribution reference grammar, as engines accept it: a registry host (with an optional port), lowercase path
# components joined by '.', '_', '__' or dashes, an optional tag. Nothing else may reach the engine's argv.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
REPOSITORY = rf"{_HOST}/{_COMPONENT}(?:/{_COMPONENT})*"
_DESTINATION = re.compile(rf"{REPOSITORY}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?")


def inspect_argv(name: str, engine: str, lock: Mapping[str, Any]) -> list[str]:
    return [check_engine(engine), "image", "inspect", lock_entry(name, lock)["reference"]]


def parse_inspect(stdout: str) -> dict[str, Any] | None:
    """`Id`, `RepoDigests`, labels and `Size` (bytes, all layers) from `ENGINE image inspect` output; None when it
    is not an image."""
    try:
        data = json.loads(stdout)[0]
    except (ValueError, LookupError, TypeError):
        return None
    labels = (data.get("Config") or {}).get("Labels") or data.get("Labels") or {}
    size = data.get("Size")
    return {
        "id": data.get("Id"),
        "repo_digests": data.get("RepoDigests") or [],
        "labels": labels,
        "size": size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
    }


# --- lock resolution (a machine that reaches the registries) ------------------------------------------------

RESOLVERS = ("buildx", "skopeo")


def resolve_digest_argv(reference: str, tool: str) -> list[str]:
    """Ask a registry for the digest a tag points at (the multi-platform index where there is one)."""
    repo, tag, _ = split_reference(reference)
    bare = f"{repo}:{tag}" if tag else repo
    if tool == "buildx":
        return ["docker", "buildx", "imagetools", "inspect", bare, "--format", "{{json .Manifest}}"]
    if tool == "skopeo":
        return ["skopeo", "inspect", "--raw", f"docker://{bare}"]
    raise UserError("unknown resolver", field="--tool", value=tool, fix=f"use one of: {', '.join(RESOLVERS)}")


def parse_digest(tool: str, stdout: str) -> str:
    """The digest from `resolve_digest_argv` output: buildx names it; skopeo's raw manifest is hashed."""
    if tool == "skopeo":
        return "sha256:" + hashlib.sha256(stdout.encode()).hexdigest()
    try:
        digest = json.loads(stdout)["digest"]
    except (ValueError, LookupError, TypeError):
        digest = None
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise UserError(
            "the registry answer names no digest", source="docker buildx imagetools", value=stdout
        )
    return digest


def set_dockerfile_arg(text: str, name: str, value: str) -> str:
    """Rewrite the default of `ARG NAME=…` (the first declaration); other lines stay byte-identical."""
    pattern = re.compile(rf"^(\s*ARG\s+{name})(?:=.*)?$", re.MULTILINE)
    if not pattern.search(text):
        raise UserError(f"the Dockerfile declares no ARG {name}", field=name)
    return pattern.sub(lambda m: f"{m.group(1)}={value}", text, count=1)


def execute(
    argv: Sequence[str], *, cwd: Path | None = None, capture: bool = False, runner: Runner = subprocess.run
):
    """Run one argv (never through a shell); a missing binary is a UserError, the exit code is the caller's."""
    try:
        return runner(
            list(argv), cwd=cwd, check=False, text=True, capture_output=capture, env=settings.child_env()
        )
    except FileNotFoundError:
        raise UserError(f"'{argv[0]}' is not installed or not on PATH", fix=f"install {argv[0]}") from None
