"""The kit's images as every layer needs to know them: their names, which image runs which step, and the
reference each is built and run under (`images/images.lock.json` in a checkout, else the default).

The rest of the image machinery (Dockerfiles, lock files, build/push/pull argv) is `draftscope.ops.images`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.core import schema, settings
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.resources import repo_root as _checkout

# vllm-cpu is the CPU twin of vllm and train (vLLM's CPU backend and speculators on a CPU torch, on a local base):
# the image the real vLLM engine runs in on machines without a GPU (tests, CI). It is not a GPU image.
# sglang-cpu is the CPU twin of sglang: SGLang 0.5.18 on its CPU engine, its kernel built from the release's sources
# (a build input checked by SHA-256, `kernel_sources` in the lock). It needs a CPU with AMX to serve a draft.
IMAGES = ("transformers", "vllm", "train", "sglang", "vllm-cpu", "sglang-cpu")

LOCK_FILE = "images.lock.json"
# A lock file other than the checkout's: a reviewer's copy that records where the images were published
# (`make kick-the-tires` writes one for its loopback registry). Every reader of the lock honours it.
LOCK_ENV = settings.DRAFTSCOPE_IMAGES_LOCK.name
# How `unpinned` flags a base built on this machine: nothing can pin it by a registry digest.
LOCAL_BASE = "is built locally and has no registry digest"
SOURCE_URL = "https://github.com/draftscope/draftscope"


# --- names and references -----------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if name not in IMAGES:
        raise UserError(f"no image named '{name}'", field="image", fix=f"choose one of: {', '.join(IMAGES)}")


def _default_reference(name: str) -> str:
    # `localhost/` keeps engines from looking the name up in a registry.
    return f"localhost/draftscope-{name}:{__version__}"


def image_reference(name: str) -> str:
    """The reference an image is built and run under: from images.lock.json in a checkout, else the default."""
    _check_name(name)
    try:
        entry = load_lock()["images"].get(name)
    except UserError:
        entry = None
    return entry["reference"] if entry else _default_reference(name)


def split_reference(reference: str) -> tuple[str, str | None, str | None]:
    """`repo[:tag][@sha256:…]` → (repo, tag, digest). A port in the registry host is not a tag."""
    ref, _, digest = reference.partition("@")
    repo, tag = ref, None
    head, sep, tail = ref.rpartition(":")
    if sep and "/" not in tail:
        repo, tag = head, tail
    return repo, tag, digest or None


# --- the checkout and images.lock.json ----------------------------------------------------------------------


def checkout() -> Path:
    """The checkout the images are built from; a UserError when the kit runs from an installed wheel."""
    root = _checkout()
    if root is None or not (root / "images").is_dir():
        raise UserError(
            "the images are built from a checkout of the kit, and this is an installed copy",
            fix=f"clone {SOURCE_URL} and run the task there",
        )
    return root


def lock_path(root: Path | None = None) -> Path:
    return (root or checkout()) / "images" / LOCK_FILE


def active_lock_path() -> Path:
    """The lock the kit reads: $DRAFTSCOPE_IMAGES_LOCK when set, else the checkout's images.lock.json."""
    return settings.DRAFTSCOPE_IMAGES_LOCK.get() or lock_path()


def load_lock(path: Path | None = None) -> dict[str, Any]:
    """images.lock.json (or $DRAFTSCOPE_IMAGES_LOCK), validated against schemas/images-lock.schema.json."""
    path = path or active_lock_path()
    if not path.exists():
        raise UserError(f"{path} does not exist", fix="restore it from the repository")
    data = read_json(path, expect=dict)
    schema.check(data, "images-lock", str(path))
    return data


def lock_entry(name: str, lock: Mapping[str, Any] | None = None) -> dict[str, Any]:
    _check_name(name)
    lock = lock if lock is not None else load_lock()
    entry = lock["images"].get(name)
    if entry is None:
        raise UserError(f"image '{name}' is missing from images/{LOCK_FILE}", fix="restore the file")
    return entry


def published_reference(entry: Mapping[str, Any]) -> str | None:
    """`repository@digest` of a pushed image (what `invoke images.pull` pulls), or None before any push."""
    repository, digest = entry.get("repository"), entry.get("digest")
    return f"{repository}@{digest}" if repository and digest else None


def is_local(reference: str) -> bool:
    """A reference built on this machine (`localhost/…`): no registry holds it, so it has no registry digest."""
    return reference.startswith("localhost/")


def base_reference(entry: Mapping[str, Any]) -> str:
    """The base as FROM sees it: `ref@digest` when the digest is known, else the bare reference."""
    base = entry["base"]
    return f"{base['reference']}@{base['digest']}" if base["digest"] else base["reference"]


def unpinned(lock: Mapping[str, Any]) -> list[str]:
    """One line per thing images.lock.json leaves unpinned (bases without a digest)."""
    lines = []
    for name, entry in lock["images"].items():
        base = entry["base"]
        if not base["digest"]:
            why = LOCAL_BASE if is_local(base["reference"]) else "is not pinned by digest"
            because = f" ({base['unpinned_because']})" if base.get("unpinned_because") else ""
            lines.append(f"{name}: base {base['reference']} {why}{because}")
    return lines
