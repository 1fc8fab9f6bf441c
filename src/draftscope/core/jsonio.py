"""Durable JSON writing, and the one reading boundary of every file the kit reads.

A reader never sees half a JSON file (temp file + fsync + rename), and a killed writer leaves every finished
JSON Lines record readable: each record is one `write()` of one complete line, flushed and fsynced.

Reading is `core.reading` (the reading boundary: regular files only, explicit limits, a UserError naming the file
for every failure); its readers are re-exported here, where the kit has always imported them from.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from draftscope.core.reading import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_NUMBER_CHARS,
    decode_utf8,
    iter_jsonl,
    open_regular,
    parse_json,
    read_bytes,
    read_json,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_NUMBER_CHARS",
    "JsonlAppender",
    "atomic_write_json",
    "atomic_write_text",
    "decode_utf8",
    "dumps",
    "iter_jsonl",
    "open_regular",
    "parse_json",
    "read_bytes",
    "read_json",
    "repair_tail",
    "sha256_file",
]


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old or the new content, never a mix."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; artifacts are meant to be read by others (reviewers), as the umask allows.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Covers KeyboardInterrupt too: never leave a stray temp file behind.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, dumps(obj))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class JsonlAppender:
    """Appends one JSON object per line; each record is flushed and fsynced before `append` returns."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # O_APPEND: each write lands at the end even if another handle wrote meanwhile.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
        end = os.fstat(self._fd).st_size
        # One write() per record: a kill leaves either the whole line or none of it.
        try:
            written = os.write(self._fd, line)
            if written != len(line):  # a full disk writes what fits
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)", str(self.path))
            os.fsync(self._fd)
        except OSError:
            # Cut the partial line so the file still ends with a whole record (a torn line would make every
            # reader refuse the file); the caller sees the error.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def repair_tail(path: Path) -> int:
    """Cut a torn last line (a kill mid-write) so the file ends with a complete record; returns bytes cut."""
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as handle:
        data = handle.read()
        end = data.rfind(b"\n") + 1
        last_ok = end
        if end < len(data):
            try:
                json.loads(data[end:])
                handle.write(b"\n")  # a complete record that only lacks its newline
                return 0
            except (ValueError, RecursionError):
                pass
        handle.truncate(last_ok)
        handle.flush()
        os.fsync(handle.fileno())
    return size - last_ok


def read_submitted(
    path: Path, *, what: str, folder: str, schema_version: int, kind: str | None = None
) -> dict:
    """A job file written on the submitting host and read on a compute node (a Slurm job's plan or benchmark):
    unreadable, or written by another kit version (`schema_version`, and `kind` where given), is one clear error."""
    from draftscope.core.errors import UserError

    try:
        doc = read_json(path)
    except Exception as exc:
        raise UserError(
            f"cannot read the submitted {what} ({exc})",
            source=str(path),
            fix=f"the {folder} must be on storage every node sees; resubmit",
        ) from None
    if (
        not isinstance(doc, dict)
        or doc.get("schema_version") != schema_version
        or (kind is not None and doc.get("kind") != kind)
    ):
        raise UserError(f"not a {what} file of this kit version", source=str(path), fix="resubmit")
    return doc
