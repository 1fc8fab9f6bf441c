"""Which host operating systems run which part of the kit — the platform rules, as code.

- Planning, dry runs, analysis, validation, `share` and `doctor`: Linux, macOS and Windows (pure Python, no torch).
- The Transformers backend: wherever a CUDA build of torch runs (Linux, Windows); `--device cpu` anywhere.
- vLLM and SGLang (the vLLM benchmark backend, regen, vLLM hidden-state extraction, serve, bench): Linux only.
  Both publish Linux wheels only (sglang 0.5.23: manylinux_2_34), and their images need the NVIDIA Container
  Toolkit, which passes GPUs to containers on Linux hosts (on Windows: inside WSL2, which is Linux to the kit).

Callers refuse before anything is created: `require_linux(ENGINE)` in the preflight of a real run, never in a dry
run (a dry run is planning, and planning works everywhere).
"""

from __future__ import annotations

import os
import sys

from draftscope.core.errors import UserError

# Engines that run on Linux hosts only, by the name the kit uses for them (image and backend names).
LINUX_ONLY = {"vllm": "vLLM", "sglang": "SGLang"}
_NAMES = {"linux": "Linux", "darwin": "macOS", "win32": "Windows", "cygwin": "Windows (Cygwin)"}
# The images' own non-root user (images/*/Dockerfile `USER 10001:10001`).
IMAGE_USER = (10001, 10001)


def host_name(system: str | None = None) -> str:
    """A readable name of `sys.platform` (or of the given value)."""
    system = system or sys.platform
    return _NAMES.get(system, system)


def refusal(engine: str, system: str | None = None) -> str | None:
    """The one-line reason `engine` cannot run on this host, or None when it can (or needs no rule)."""
    system = system or sys.platform
    if engine not in LINUX_ONLY or system.startswith("linux"):
        return None
    return (
        f"{LINUX_ONLY[engine]} runs on Linux hosts only (Linux wheels; GPUs reach its container through the NVIDIA"
        f" Container Toolkit) and this host is {host_name(system)}"
    )


def require_linux(engine: str, *, system: str | None = None, field: str | None = None) -> None:
    """Refuse a real run of a Linux-only engine on another host, with the fix; nothing to do on Linux."""
    reason = refusal(engine, system)
    if reason is not None:
        raise UserError(
            reason,
            field=field,
            fix="run it on a Linux machine with an NVIDIA GPU (on Windows: inside WSL2); planning and --dry-run"
            " work here",
        )


def host_user() -> tuple[int, int]:
    """(uid, gid) that containers run as: the invoking user on POSIX hosts; on Windows, which has no numeric
    ids, the images' own user (Docker Desktop's Linux VM owns the bind mounts there). `os.getuid` does not exist
    on Windows, so a default that calls it breaks every dry run there."""
    getuid, getgid = getattr(os, "getuid", None), getattr(os, "getgid", None)
    if getuid is None or getgid is None:
        return IMAGE_USER
    return getuid(), getgid()
