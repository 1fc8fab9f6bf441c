"""`@command`: invoke's `@task` with the kit's three conventions, through invoke's documented `klass=` hook.

- Errors: an expected failure is one line and an exit code (`handler.exits`), never a traceback.
- Help: `-h` stays invoke's help flag (no option takes it as its short flag), and `--help` or `-h` where a
  positional argument is expected asks for help. invoke's parser gives a missing positional the next word, so
  without this `invoke validate --help` would validate a folder named `--help`. (The `draftscope` command turns
  these into `draftscope --help TASK` before parsing, `cli.program`; this is the same for `invoke`.)
- Several values: `variadic="run"` names the repeatable option (declared in `iterable`) that takes the words after
  the positionals, for `draftscope analyze A B C` (`cli.program`); `invoke` takes them as `--run B --run C`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from invoke import Collection, Context, Program, Task, task
from invoke.parser import Argument

from draftscope.cli.handler import exits

HELP_WORDS = ("--help", "-h")
CONFIG_KEY = "draftscope"  # a group's collection config: {"draftscope": {"group": NAME}}, for its tasks' help


class Command(Task):
    """A task of the kit's command line (see the module docstring)."""

    def __init__(self, body: Callable[..., Any], *, variadic: str | None = None, **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        if variadic is not None and variadic not in self.iterable:
            raise ValueError(f"task {self.name}: variadic={variadic!r} must be one of its iterable options")
        self.variadic = variadic

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        # invoke's arg_opts pops each help string as it uses it: a second parser of the same task (the help below,
        # `cli.program`'s rewrite) would show no option's help. Each call reads a copy.
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        # `h` counts as taken: an option with `-h` would hide invoke's `TASK -h`. invoke picks the first free
        # character of the dashed name, so an option whose letters are all taken would get the dash itself
        # (`--draft-tokens` shown as `--=STRING`, a bare `--` on the command line): such an option has no short flag.
        opts = super().arg_opts(name, default, {*taken_names, "h"})
        opts["names"] = [n for n in opts["names"] if len(n) > 1 or n.isalnum()]
        return opts

    def __call__(self, c: Context, *args: Any, **kwargs: Any) -> Any:
        if self.asks_for_help(args, kwargs):
            group = (c.config.get(CONFIG_KEY) or {}).get("group")
            print_help(self, group)
            return None
        with exits():
            return super().__call__(c, *args, **kwargs)

    def asks_for_help(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A positional argument got `--help` or `-h`: the user asked for help, not for a path of that name."""
        given = [*args, *(kwargs.get(name) for name in self.positional)]
        return any(isinstance(value, str) and value in HELP_WORDS for value in given)


def command(*args: Any, **kwargs: Any) -> Any:
    """`@command` / `@command(help=…, variadic=…)`: `@task` making a `Command`."""
    return task(*args, klass=Command, **kwargs)


def group(name: str, *tasks: Task) -> Collection:
    """A named collection of tasks (`images.build`); its name is in its tasks' config, for their help."""
    collection = Collection(name, *tasks)
    collection.configure({CONFIG_KEY: {"group": name}})
    return collection


def print_help(cmd: Task, group: str | None = None, binary: str = "inv[oke]") -> None:
    """invoke's own help for one task (`invoke --help GROUP.TASK`), printed from the task alone."""
    root = Collection()
    if group:
        root.add_collection(Collection(group, cmd))
    else:
        root.add_task(cmd)
    name = f"{group}.{cmd.name}" if group else cmd.name
    Program(namespace=root, binary=binary).run([binary, "--help", name], exit=False)
