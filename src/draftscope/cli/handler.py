"""The invoke side of the one error handler (`draftscope.core.errors.exit_status`): an expected failure becomes
invoke's `Exit` (one line on stderr, its exit code), never a traceback; a bug keeps its traceback."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from invoke import Exit

from draftscope.core.errors import exit_status


@contextlib.contextmanager
def exits() -> Iterator[None]:
    """A user error exits 2, running out of memory 3, each as one line (`exit_status`); anything else propagates."""
    try:
        yield
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        code, line = status
        raise Exit(line, code=code) from None


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`exits()` around a task body, for tasks declared with invoke's plain `@task` (`cli.command` does it itself)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with exits():
            return fn(*args, **kwargs)

    return wrapper
