"""invoke tasks for draftscope. `invoke --list` shows them; each task's docstring is its --help.

The task bodies live in `draftscope.cli.tasks` so that the installed `draftscope` command runs the same tasks.
"""

from draftscope.cli.tasks import join_variadic, ns  # noqa: F401  (invoke looks for `ns` here)


def _accept_several_runs() -> None:
    """`invoke analyze A B …`: invoke reads words after a task's positional as task names. This file is loaded
    after invoke split off its own flags and before it parses the tasks, so the run paths are joined here."""
    import invoke.main

    core = getattr(invoke.main.program, "core", None)
    if core is not None and hasattr(core, "unparsed"):
        core.unparsed = join_variadic(list(core.unparsed))


_accept_several_runs()
