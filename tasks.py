"""invoke tasks for draftscope. `invoke --list` shows them; each task's docstring is its --help.

The task bodies live in `draftscope.cli` so that the installed `draftscope` command runs the same tasks.
"""

from draftscope.cli import ns  # noqa: F401  (invoke looks for `ns` here)
