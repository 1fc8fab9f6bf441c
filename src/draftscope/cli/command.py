"""`@command`: invoke's `@task` with the kit's three conventions, through invoke's documented `klass=` hook.

- Errors: an expected failure is one line and an exit code (`handler.exits`), never a traceback.
- Help: `-h` stays invoke's help flag (no option takes it as its short flag), and `--help` or `-h` where a
  positional argument is expected asks for help. invoke's parser gives a missing positional the next word, so
  without this `invoke validate --help` would validate a folder named `--help`. (The `draftscope` command turns
  these into `draftscope --help TASK` before parsing, `cli.program`; this is the same for `invoke`.)
- Values: every value is checked before the task sees it (`checked_values`): no NUL byte, UTF-8 only (the kit
  records values in JSON and prints them), and an option declared with an integer default is parsed here into an
  `int` (invoke's own cast would end in a traceback on `nan`), each failure one `error:` line naming the option.
- Several values: `variadic="run"` names the repeatable option (declared in `iterable`) that takes the words after
  the positionals, for `draftscope analyze A B C` (`cli.program`); `invoke` takes them as `--run B --run C`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from invoke import Collection, Context, Program, Task, task
from invoke.parser import Argument

from draftscope.cli.handler import exits
from draftscope.core.errors import UserError

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
            arguments = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept
        # An integer option is shown as INT; the parser keeps its text and __call__ parses it (one error: line).
        for arg in arguments:
            if arg.kind is int:
                arg.set_value = functools.partial(_keep_text, arg)  # type: ignore[method-assign]
        return arguments

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
            args, kwargs = self.checked_values(args, kwargs)
            return super().__call__(c, *args, **kwargs)

    def asks_for_help(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A positional argument got `--help` or `-h`: the user asked for help, not for a path of that name."""
        given = [*args, *(kwargs.get(name) for name in self.positional)]
        return any(isinstance(value, str) and value in HELP_WORDS for value in given)

    def checked_values(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The values with the integer options parsed; a value no command can take refused (see the docstring)."""
        ints = {n for n, default in self._defaults().items() if type(default) is int}
        out = {}
        for name, value in kwargs.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str):
                    check_text(item, _flag(name))
            out[name] = parse_int(value, _flag(name)) if name in ints and isinstance(value, str) else value
        for i, value in enumerate(args):
            if isinstance(value, str):
                check_text(value, f"argument {i + 1}")
        return args, out

    def _defaults(self) -> dict[str, Any]:
        params = inspect.signature(self.body).parameters
        return {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}


def _keep_text(arg: Argument, value: Any, cast: bool = True) -> None:
    Argument.set_value(arg, value, cast=False)


def _flag(name: str) -> str:
    dashed = name.replace("_", "-")
    return f"-{dashed}" if len(dashed) == 1 else f"--{dashed}"


def check_text(value: str, field: str) -> str:
    """`value` unless it holds a NUL byte or bytes that are not UTF-8 (the kit writes values into JSON records)."""
    if "\x00" in value:
        raise UserError("the value holds a NUL byte", field=field, value=value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            "the value is not valid UTF-8", field=field, value=value, fix="use a UTF-8 name or value"
        ) from None
    return value


def parse_int(
    value: Any, field: str, minimum: int | None = None, maximum: int | None = None, *, fix: str | None = None
) -> int:
    """`value` as an integer within [minimum, maximum]; one `error:` line naming `field` otherwise."""
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise UserError("expected an integer", field=field, value=value) from None
    if minimum is not None and number < minimum:
        raise UserError(f"must be at least {minimum}", field=field, value=value)
    if maximum is not None and number > maximum:
        raise UserError(f"must be at most {maximum:,}", field=field, value=value, fix=fix)
    return number


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
