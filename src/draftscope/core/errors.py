"""The one user-facing error type, and the one handler that turns it into an exit code.

A `UserError` is a problem with the user's input or environment, not a bug: every entry point prints it as a
single line and exits non-zero, without a traceback, through `run_main` / `exit_status` below. Its message names
what is wrong, the offending value and how to fix it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


class UserError(Exception):
    """Bad input or a failed precondition; rendered as one line."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        field: str | None = None,
        value: Any = None,
        fix: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.source:
            parts.append(f"{self.source}:")
        if self.field:
            parts.append(f"{self.field}:")
        parts.append(self.message)
        if self.value is not None:
            parts.append(f"(got {_short(self.value)})")
        text = " ".join(parts)
        if self.fix:
            text = f"{text}; fix: {self.fix}"
        # One line, always: multi-line values would break the "one-line error" contract.
        return " ".join(text.split())


class MissingDependency(UserError):
    """A heavy optional dependency is not installed here."""

    def __init__(self, module: str, *, extra: str | None = None, image: str | None = None) -> None:
        where = []
        if extra:
            where.append(f"pip install 'draftscope[{extra}]'")
        if image:
            where.append(f"run this step in the '{image}' image (--runtime docker|podman)")
        super().__init__(
            f"the Python module '{module}' is not installed in this environment",
            fix=" or ".join(where) or f"install {module}",
        )


class Interrupted(Exception):
    """The command was stopped by a signal (Ctrl-C, SIGTERM) after recording what became of its work: it exits with
    the conventional code, 128 + the signal's number (130 for SIGINT, 143 for SIGTERM), and `line` says where."""

    def __init__(self, code: int, line: str) -> None:
        self.code, self.line = code, " ".join(line.split())
        super().__init__(self.line)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the one handler of every entry point -------------------------------------------------------------------------


def exit_status(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line to print for an expected failure, or None for a bug (it keeps its traceback).

    A user error exits 2. Running out of memory exits 3, and is reported as the failure, never answered by moving
    to another device: host memory (MemoryError), or GPU memory (torch's OutOfMemoryError, matched by its type's
    name because this module may not import torch)."""
    if isinstance(exc, UserError):
        return 2, f"error: {exc.render()}"
    if isinstance(exc, Interrupted):
        return exc.code, exc.line
    if isinstance(exc, MemoryError):
        return 3, f"error: out of host memory: {exc}"
    if type(exc).__name__ == "OutOfMemoryError":
        first = (str(exc).splitlines() or [""])[0]
        return 3, f"error: out of GPU memory: {first}"
    return None


def run_main(fn: Callable[..., int | None], *args: Any) -> int:
    """Run an entry point's body: its exit code (None counts as 0), or an expected failure's one line on stderr
    and its code (`exit_status`). Anything else, KeyboardInterrupt included, propagates."""
    try:
        return int(fn(*args) or 0)
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        code, line = status
        print(line, file=sys.stderr, flush=True)
        return code
