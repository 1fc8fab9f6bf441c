"""The one user-facing error type.

A `UserError` is a problem with the user's input or environment, not a bug: the entry points print it as a
single line and exit non-zero, without a traceback. Its message names what is wrong, the offending value
and how to fix it.
"""

from __future__ import annotations

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


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
