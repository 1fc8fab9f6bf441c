"""Shared by every invoke task module: user errors become one line and exit code 2, never a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from invoke import Exit

from draftscope.core.errors import UserError


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A UserError becomes one line on stderr and exit code 2; anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            raise Exit(f"error: {exc.render()}", code=2) from None

    return wrapper
