"""invoke's tasks for this checkout: `invoke --list` shows them; each task's docstring is its --help.

They live in `draftscope.cli`, so the installed `draftscope` command runs the same tasks.
"""

from draftscope.cli import ns

__all__ = ["ns"]
