"""Exclusive, atomic creation of analysis outputs: an existing file or folder is never overwritten.

Each file is written to a temporary name, fsynced, then hard-linked to its final name: the link fails if the name
exists (exclusive), and a reader never sees half a file (atomic). Folders are created with a plain `mkdir`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from draftscope.core.errors import UserError
from draftscope.core.outputs import check_output_path


def refuse_existing(path: Path, flag: str) -> None:
    if os.path.lexists(path):
        raise UserError(
            "already exists; analysis outputs are never overwritten",
            source=str(path),
            field=flag,
            fix="choose a new path or move the old one away",
        )


def make_new_dir(path: Path, flag: str) -> Path:
    path = Path(check_output_path(path, flag))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path)
    except FileExistsError:
        refuse_existing(path, flag)
        raise  # pragma: no cover - refuse_existing always raises for an existing path
    return path


def write_new(path: Path, data: bytes, flag: str) -> None:
    """Create `path` with `data`, atomically and exclusively."""
    path = Path(check_output_path(path, flag))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; outputs are meant to be shared and read
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            refuse_existing(path, flag)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
