"""The invoke side of the one error handler (`draftscope.core.errors.exit_status`): an expected failure becomes
invoke's `Exit` (one line on stderr, its exit code), never a traceback; a bug keeps its traceback.

A path the user gave that the system cannot even look up (a name too long, a symbolic link loop, a file where a
folder belongs, no permission) is an expected failure too, wherever the command first touches it: one line naming
the path and the reason, exit 2."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from invoke import Exit

from draftscope.core.errors import UserError, exit_status

# The errors of a path that cannot be looked up or opened at all, and what to say about each.
PATH_ERRORS = {
    errno.ENAMETOOLONG: "the name is too long for the file system",
    errno.ELOOP: "a symbolic link loop",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "a read-only file system",
}


def path_error(exc: BaseException) -> UserError | None:
    """The user error a path's OSError stands for (None if it is not one of PATH_ERRORS)."""
    if isinstance(exc, OSError) and exc.errno in PATH_ERRORS:
        name = None if exc.filename is None else str(exc.filename)
        return UserError(PATH_ERRORS[exc.errno], value=name, fix="check the path")
    return None


@contextlib.contextmanager
def exits() -> Iterator[None]:
    """A user error exits 2, running out of memory 3, each as one line (`exit_status`); anything else propagates."""
    try:
        yield
    except Exception as exc:
        status = exit_status(path_error(exc) or exc)
        if status is None:
            raise
        code, line = status
        raise Exit(line, code=code) from None
