"""The model hub, as the kit uses it: where snapshots land, the one revision-pin check, and the fetch command.

Weights are pinned by a full 40-character commit SHA and fetched by a separate network step before any worker
runs (workers have no network). Every planner builds that step's argv here, so the pin rule lives in one place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from draftscope.core import settings
from draftscope.core.errors import UserError

COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
# The fetch step runs in the transformers image: it has huggingface_hub and is the smallest of the four.
FETCH_IMAGE = "transformers"
UNPINNED = "<unpinned>"  # shown in a dry run's argv for a preset with no public commit pin


def is_pinned(revision: str | None) -> bool:
    """A full lower-case commit SHA: a branch or tag name can move, a short SHA can become ambiguous."""
    return revision is not None and COMMIT_SHA.fullmatch(revision) is not None


def check_pinned(revision: str | None, *, field: str = "revision", what: str = "a download") -> str:
    """The revision, or a UserError naming the field, the value and the fix."""
    if not is_pinned(revision):
        raise UserError(
            f"{what} needs a full 40-character commit SHA",
            field=field,
            value=revision,
            fix="pin the full commit SHA (`git ls-remote` or `huggingface_hub.HfApi().model_info(repo).sha`)",
        )
    return revision  # type: ignore[return-value]


def hub_cache_dir() -> Path:
    """Where hub downloads land on the host: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else ~/.cache/huggingface/hub."""
    cache = settings.HF_HUB_CACHE.get()
    if cache is not None:
        return cache
    home = settings.HF_HOME.get() or Path(os.path.expanduser("~")) / ".cache" / "huggingface"
    return home / "hub"


def hub_snapshot(cache: str, repo: str, revision: str) -> str:
    """The hub cache's folder for one pinned snapshot (huggingface_hub's layout): the revision is in the path, so
    a later download of the same repository cannot change what a stage loads."""
    owner, name = repo.split("/", 1)
    return f"{cache.rstrip('/')}/models--{owner}--{name}/snapshots/{revision}"


def fetch_argv(cache: str, pins: Iterable[tuple[str, str | None]]) -> list[str]:
    """`python -m draftscope fetch` for these (repo, revision) pins into `cache` (a path where the step runs)."""
    argv = ["python", "-m", "draftscope", "fetch", "--cache", cache]
    for repo, revision in pins:
        argv += ["--repo", repo, "--revision", revision or UNPINNED]
    return argv


def fetch_snapshots(cache: str, pins: list[tuple[str, str]]) -> int:
    """Download each repository at its full commit SHA (never a branch name); remote code is never run."""
    try:
        # lazy: huggingface_hub is only in the images' environments, and only the fetch step needs it
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(
            "huggingface_hub is not installed", fix="run the fetch step in the kit's image"
        ) from None
    for repo, revision in pins:
        check_pinned(revision)
        path = snapshot_download(repo_id=repo, revision=revision, cache_dir=cache)
        print(f"{repo}@{revision} -> {path}")
    return 0
