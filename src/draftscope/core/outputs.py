"""The one check of a path the user gives for the kit to write (`--output`, `--workdir`, …), made before anything is
created: every refusal is one `UserError` naming the option, the value and the fix, and leaves nothing behind.

What is refused, and why here rather than at the first write: a parent that is a file, a folder this process may
not write in (a read-only mount included), a path on a kernel's special file system (`/proc`, `/sys`, `/dev`: a
write there is at best an odd error, at worst a kernel setting), a symbolic link loop or a broken link on the way.
A missing parent is fine: the callers create it (`runs/NAME` in a fresh checkout). Whether the path itself may
already exist is the caller's rule (run directories: never; a pipeline workdir: yes, to resume), given by `exists`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from draftscope.core.errors import UserError

# Kernel file systems: nothing the kit writes belongs there. /dev/shm is an ordinary tmpfs and stays allowed.
SPECIAL = ("/proc", "/sys", "/dev")
ALLOWED_UNDER_SPECIAL = ("/dev/shm",)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _stat(path: Path, flag: str, value: str, what: str) -> os.stat_result | None:
    """`path`'s stat (links followed), None when it does not exist; a loop or an unreachable path is refused."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{what} {path} is a symbolic link loop (too many levels of symbolic links)",
                field=flag,
                value=value,
                fix="remove or repair the link, or choose another path",
            ) from None
        raise UserError(
            f"{what} {path} cannot be reached: {exc.strerror or exc}",
            field=flag,
            value=value,
            fix="choose a path you may write to",
        ) from None


def check_output_path(path: Path | str, flag: str, *, exists: bool = False) -> Path:
    """Refuse `path` as an output for the kit to create (or, with `exists=True`, a folder it may reuse) unless it
    can be written; returns it unchanged. Nothing is created or changed."""
    path = Path(path)
    value = str(path)
    if "\0" in value:
        raise UserError(
            "a path cannot hold a NUL byte", field=flag, value=value, fix="give a path without it"
        )
    absolute = Path(os.path.abspath(path))
    here = _stat(absolute, flag, value, "the path")
    if here is not None and exists and not stat.S_ISDIR(here.st_mode):
        raise UserError(
            f"{absolute} exists and is not a folder",
            field=flag,
            value=value,
            fix="give a folder (or a new path), not a file",
        )
    if here is None and os.path.islink(absolute):
        raise UserError(
            f"{absolute} is a broken symbolic link",
            field=flag,
            value=value,
            fix="remove the link or choose another path",
        )
    # The nearest existing ancestor: where the first folder will be made.
    anchor = absolute if here is not None and exists else absolute.parent
    while True:
        found = _stat(anchor, flag, value, "the folder")
        if found is not None:
            break
        if os.path.islink(anchor):
            raise UserError(
                f"{anchor} is a broken symbolic link",
                field=flag,
                value=value,
                fix="remove the link or choose another path",
            )
        if anchor.parent == anchor:  # pragma: no cover - the root always exists
            break
        anchor = anchor.parent
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise UserError(
            f"{anchor} is a file, not a folder, so nothing can be created under it",
            field=flag,
            value=value,
            fix="choose a path whose parent is a folder",
        )
    real = os.path.realpath(anchor)
    if _under(real, SPECIAL) and not _under(real, ALLOWED_UNDER_SPECIAL):
        raise UserError(
            f"{real} is on a kernel file system ({', '.join(SPECIAL)}), not storage",
            field=flag,
            value=value,
            fix="choose a path on a disk, e.g. runs/NAME",
        )
    if not os.access(anchor, os.W_OK | os.X_OK):
        read_only = _read_only(anchor)
        raise UserError(
            f"the folder {anchor} is not writable"
            + (" (a read-only file system)" if read_only else " by this user"),
            field=flag,
            value=value,
            fix="choose a folder you may write to" + ("" if read_only else " (or fix its permissions)"),
        )
    return path


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
