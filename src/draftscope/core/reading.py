"""The one reading boundary of every file the kit reads: regular files only, explicit limits, one kind of error.

A file is refused, as a UserError that names it, the problem and the fix, when it is not a regular file (a named
pipe would block the reader forever, a device never ends), larger than the limit (checked before reading), not
UTF-8, not valid JSON, nested deeper than MAX_DEPTH, holding a number literal longer than MAX_NUMBER_CHARS or out of
a double's range, NaN or Infinity (not JSON), a key twice in one object, or of the wrong kind at the top level
(`expect=`). JSON Lines files are streamed, each line bounded. YAML goes through `config.load_yaml`, which reads
its bytes here (`read_bytes`) and applies the same limits in its own loader.

`core.jsonio` re-exports these readers, so `from draftscope.core.jsonio import read_json` keeps working.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from draftscope.core.errors import UserError

# The one size limit of a file the kit reads whole: a prompt set, a config, a manifest is far smaller. A larger
# file is a mistake (a dataset, a log); callers that need another limit pass `limit=`.
MAX_FILE_BYTES = 64 * 2**20
# The longest line of a JSON Lines file (a record); the file itself may be any size, it is streamed.
MAX_LINE_BYTES = 16 * 2**20
# No file the kit reads nests deeper than a handful of levels; 64 leaves room and stays far from recursion limits.
MAX_DEPTH = 64
# Longer than any int64 or float repr (a seed, a byte count, a latency); Python's own int limit is 4300 digits.
MAX_NUMBER_CHARS = 100

_KINDS = {dict: "a JSON object", list: "a JSON array", str: "a string", int: "an integer", float: "a number"}
_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class _Refused(ValueError):
    """A parse hook's refusal (raised out of json.loads, turned into a UserError by the caller)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def _mib(size: int) -> str:
    if size < 2**20:
        return f"{size} bytes"
    return f"{size / 2**20:.1f} MiB" if size % 2**20 else f"{size // 2**20} MiB"


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _FILE_TYPES if test(mode)), "not a regular file")


def _open_regular(path: Path, limit: int | None) -> int:
    """The fd of a regular file opened for reading, or a UserError naming the file.

    stat() first, so a FIFO, a directory or a device is refused before open(); O_NONBLOCK, so that even a FIFO
    swapped in between cannot block the open; fstat() of the opened fd, so what is read is what was checked."""
    source = str(path)
    if "\0" in source:
        raise UserError("a path cannot hold a NUL byte", source=repr(source), fix="check the path")
    try:
        before = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError("file not found", source=source, fix="check the path") from None
    except OSError as exc:
        raise UserError(
            f"cannot be read ({exc.strerror})", source=source, fix="check the path and its permissions"
        ) from None
    _require_regular(before, source, limit)
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UserError("file not found", source=source, fix="check the path") from None
    except OSError as exc:
        raise UserError(
            f"cannot be read ({exc.strerror})", source=source, fix="check the path and its permissions"
        ) from None
    try:
        opened = os.fstat(fd)
        _require_regular(opened, source, limit)
        os.set_blocking(fd, True)  # a regular file: reads never block anyway; no surprises for the caller
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(st: os.stat_result, source: str, limit: int | None) -> None:
    what = _not_regular(st.st_mode)
    if what is not None:
        raise UserError(
            f"is {what}, not a regular file", source=source, fix="give the path of a regular file"
        )
    if limit is not None and st.st_size > limit:
        raise UserError(
            f"the file is {_mib(st.st_size)}; the limit is {_mib(limit)}",
            source=source,
            fix="check that this is the right file; a larger one must be split",
        )


def open_regular(path: Path, *, limit: int | None = None) -> BinaryIO:
    """A regular file opened for binary reading (a FIFO, a directory or a device is a UserError, never a hang),
    of at most `limit` bytes when given."""
    return os.fdopen(_open_regular(Path(path), limit), "rb")


def read_bytes(path: Path, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The content of a regular file of at most `limit` bytes (checked before reading), or a UserError."""
    path = Path(path)
    fd = _open_regular(path, limit)
    chunks: list[bytes] = []
    total = 0
    try:
        while True:  # up to limit + 1 bytes: a file that grew past the limit since fstat is refused too
            try:
                block = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as exc:
                raise UserError(f"cannot be read ({exc.strerror})", source=str(path)) from None
            if not block:
                break
            chunks.append(block)
            total += len(block)
            if total > limit:
                raise UserError(
                    f"the file grew past the limit of {_mib(limit)} while it was read",
                    source=str(path),
                    fix="do not write to the file while the kit reads it",
                )
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode_utf8(data: bytes | str, source: str, where: str = "") -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{where}not UTF-8 text ({exc.reason} at byte {exc.start})",
            source=source,
            fix="save the file as UTF-8",
        ) from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict; a key given twice is refused (json.loads would keep the last silently)."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Refused(f"the key {key!r} appears twice in one object", "keep one of the two entries")
        obj[key] = value
    return obj


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(
            f"a number literal of {len(text)} digits (the limit is {MAX_NUMBER_CHARS} characters)",
            "give numbers of ordinary size; a long digit string belongs in a JSON string",
        )
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused(
            f"a number literal of {len(text)} characters (the limit is {MAX_NUMBER_CHARS})",
            "give numbers of ordinary size",
        )
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(
            f"the number {text} is out of the range of a double", "give a finite number of ordinary size"
        )
    return value


def _parse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not JSON (JSON has no NaN or Infinity)", "give a finite number, or null")


def _depth_beyond(value: Any, limit: int) -> bool:
    """Whether containers nest deeper than `limit` (the top-level container is depth 1); no recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _kind(expect: type | tuple[type, ...]) -> str:
    kinds = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join(_KINDS.get(k, k.__name__) for k in kinds)


def _found(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return _KINDS.get(type(value), type(value).__name__)


def parse_json(
    data: bytes | str, source: str, *, expect: type | tuple[type, ...] | None = None, line: int | None = None
) -> Any:
    """One JSON document (a file's text, or one line of a JSON Lines file: `line`), within the limits above;
    any failure is a UserError naming `source` (and the line)."""
    where = f"line {line}: " if line is not None else ""
    text = decode_utf8(data, source, where)
    fix = None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except _Refused as exc:
        problem, fix = exc.message, exc.fix
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if line is not None else f"line {exc.lineno} column {exc.colno}"
        problem = f"not valid JSON: {exc.msg} at {at}"
        if not text.strip():
            problem, fix = "not valid JSON: the file is empty", "give a JSON document"
        elif text.startswith("\ufeff"):
            problem, fix = (
                "not valid JSON: it starts with a byte-order mark",
                "save it as UTF-8 without a BOM",
            )
        else:
            fix = "fix the JSON syntax"
    except RecursionError:
        problem, fix = _too_deep()
    except ValueError as exc:  # any other refusal of a literal (e.g. an integer past Python's digit limit)
        problem, fix = f"a value cannot be read: {exc}", "give numbers of ordinary size"
    else:
        if _depth_beyond(value, MAX_DEPTH):
            problem, fix = _too_deep()
        elif expect is not None and not isinstance(value, expect):
            problem = f"expected {_kind(expect)} at the top level, got {_found(value)}"
            fix = f"give {_kind(expect)}"
        else:
            return value
    raise UserError(f"{where}{problem}", source=source, fix=fix)


def _too_deep() -> tuple[str, str]:
    return (
        f"nested deeper than {MAX_DEPTH} levels",
        f"flatten the document (at most {MAX_DEPTH} levels of nesting)",
    )


def read_json(
    path: Path, *, expect: type | tuple[type, ...] | None = None, limit: int = MAX_FILE_BYTES
) -> Any:
    """A JSON file through the reading boundary: a regular file of at most `limit` bytes, parsed within the
    limits above, its top level of the kind `expect` (when given); every failure is a UserError naming it."""
    path = Path(path)
    return parse_json(read_bytes(path, limit=limit), str(path), expect=expect)


def iter_jsonl(
    path: Path,
    *,
    expect: type | tuple[type, ...] | None = None,
    max_line: int = MAX_LINE_BYTES,
    final_newline: bool = True,
) -> Iterator[tuple[int, Any]]:
    """Yield (line number, object) for every non-blank line, streaming (the file may be large; a line is at most
    `max_line` bytes); an overlong or invalid line is a UserError naming the file and the line. A last line
    without its newline is a torn record (a killed writer), refused, unless `final_newline=False` (a file written
    by hand, such as an input data set)."""
    path = Path(path)
    source = str(path)
    with open_regular(path) as fh:
        number = 0
        while raw := fh.readline(max_line + 1):
            number += 1
            if len(raw) > max_line and not raw.endswith(b"\n"):
                raise UserError(
                    f"line {number} is longer than {_mib(max_line)}",
                    source=source,
                    fix="check that this is the right file (one JSON record per line)",
                )
            if final_newline and not raw.endswith(b"\n"):
                raise UserError(f"line {number} is incomplete (no newline): a torn record", source=source)
            if not raw.strip():
                continue
            yield number, parse_json(raw, source, expect=expect, line=number)
