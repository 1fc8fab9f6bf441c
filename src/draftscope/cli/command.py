"""`@command`: invoke's `@task` made from an option table, through invoke's documented `klass=` hook.

- Options: a task declares an `OptionTable` (`core.options`: flag, config field, type, help, bounds, default, each
  once) with `@command(table=…)`, or plain keyword defaults and a `help` dict, from which the same table is made
  (`from_signature`). The task's parameters, its help (`help_text`: the usage line with its positional arguments,
  each option's type and default) and the one parse of its values (`OptionTable.parse`) come from the table. invoke
  only splits the words: every value reaches the table as the text typed (`TextArgument`), so `--repeats nan` is one
  `error:` line naming `--repeats`, never a traceback from a cast.
- Flags: long ones only (`--max-seconds`), the same for the whole kit; `-h` stays help. The short flags invoke used
  to pick per task (`-a` for `--max-seconds`) are gone, and a word that used one is answered with the option it was
  (`legacy_short_flags`, `cli.program`).
- Errors: an expected failure is one line and an exit code (`handler.exits`), never a traceback.
- Help: `--help` or `-h` where a positional argument is expected asks for help (invoke's parser would give the word
  to the positional: `invoke validate --help` would validate a folder named `--help`).
- Several values: `variadic="run"` names the repeatable option that takes the words after the positionals, for
  `draftscope analyze A B C` (`cli.program`); `--run B --run C` is the same, typed out.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from invoke import Collection, Context, Task, task
from invoke.parser import Argument

from draftscope.cli.handler import exits
from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable, check_text, from_signature

HELP_WORDS = ("--help", "-h")
CONFIG_KEY = "draftscope"  # a group's collection config: {"draftscope": {"group": NAME}}, for its tasks' help

# `defaults=`: what a task's config options default to, for its help: (where from, e.g. "preset tiny-cpu", and the
# value of each dotted field).
Defaults = Callable[[], tuple[str, Callable[[str], Any]]]


class TextArgument(Argument):
    """An invoke Argument that keeps the text typed: the option table parses it (one path, one error line)."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast=False)


class Command(Task):
    """A task of the kit's command line (see the module docstring)."""

    def __init__(
        self,
        body: Callable[..., Any],
        *,
        table: OptionTable | None = None,
        defaults: Defaults | None = None,
        variadic: str | None = None,
        **kwargs: Any,
    ) -> None:
        if table is not None:
            body.__signature__ = _signature(table)  # type: ignore[attr-defined]
            kwargs.setdefault("positional", table.positional)
            kwargs.setdefault("iterable", [r.name for r in table if r.repeatable])
            kwargs.setdefault("help", {r.name: r.help for r in table})
        kwargs["auto_shortflags"] = False
        super().__init__(body, **kwargs)
        self.table = table or from_signature(
            self._defaults(), self.help, iterable=self.iterable, positional=self.positional
        )
        self.defaults = defaults
        if variadic is not None and variadic not in self.iterable:
            raise ValueError(f"task {self.name}: variadic={variadic!r} must be one of its iterable options")
        self.variadic = variadic

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        # invoke's arg_opts pops each help string as it uses it: a second parser of the same task would show no
        # option's help. Each call reads a copy.
        kept = dict(self.help)
        try:
            arguments = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept
        out = []
        for arg in arguments:
            row = self.table.by_name.get(arg.attr_name or arg.name)
            kind = list if arg.kind is list else bool if arg.kind is bool else row.kind if row else arg.kind
            out.append(
                TextArgument(
                    names=arg.names,
                    kind=kind if kind in (list, bool, int) else str,  # int: invoke's help shows INT
                    default=arg.default,
                    help=arg.help,
                    positional=arg.positional,
                    optional=arg.optional,
                    incrementable=arg.incrementable,
                    attr_name=arg.attr_name,
                )
            )
        return out

    def __call__(self, c: Context, *args: Any, **kwargs: Any) -> Any:
        if self.asks_for_help(args, kwargs):
            group = (c.config.get(CONFIG_KEY) or {}).get("group")
            print(help_text(self, f"{group}.{self.name}" if group else self.name))
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
        """The values parsed by the task's option table (each failure one `error:` line naming the option)."""
        for i, value in enumerate(args):
            if isinstance(value, str):
                check_text(value, f"argument {i + 1}")
        known = {k: v for k, v in kwargs.items() if k in self.table}
        parsed = self.table.parse(known)
        # Every option reaches the body, as invoke's parser hands them all: a task called with some (a test) gets
        # the others' defaults; those its positional arguments give stay as given.
        by_position = list(self._defaults())[: len(args)]
        return args, {**kwargs, **{k: v for k, v in parsed.items() if k not in by_position}}

    def _defaults(self) -> dict[str, Any]:
        params = list(inspect.signature(self.body).parameters.items())[1:]
        return {n: (None if p.default is inspect.Parameter.empty else p.default) for n, p in params}

    def legacy_short_flags(self) -> dict[str, str]:
        """The short flags invoke picked for this task before the kit stopped using them: `{"-a": "--max-seconds"}`
        (invoke's rule: the first letter of the dashed name not taken yet, in the order of the parameters)."""
        names = list(self._defaults())
        taken = {*names, "h"}
        out = {}
        for name in names:
            dashed = name.replace("_", "-")
            for char in dashed:
                if char.isalnum() and char != dashed and char not in taken:
                    out[f"-{char}"] = f"--{dashed}"
                    taken.add(char)
                    break
            taken.add(dashed)
        return out


def _signature(table: OptionTable) -> inspect.Signature:
    """The task body's signature the table stands for: the context, then each option with its invoke default."""
    params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for row in table:
        default: Any = inspect.Parameter.empty if row.positional else None
        if row.kind is bool:
            default = False
        elif row.field is None and row.default is not None and not row.repeatable:
            default = row.default
        params.append(inspect.Parameter(row.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
    return inspect.Signature(params)


def parse_int(
    value: Any, field: str, minimum: int | None = None, maximum: int | None = None, *, fix: str | None = None
) -> int:
    """`value` as an integer within [minimum, maximum]; one `error:` line naming `field` otherwise."""
    row = Option(
        "value", "", kind=int, minimum=minimum, maximum=maximum, fix=fix, metavar=field, positional=True
    )
    try:
        return int(row.parse(value))
    except UserError as exc:
        raise UserError(exc.message, field=field, value=exc.value, fix=exc.fix) from None


def command(*args: Any, **kwargs: Any) -> Any:
    """`@command` / `@command(table=…, defaults=…, help=…, variadic=…)`: `@task` making a `Command`."""
    return task(*args, klass=Command, **kwargs)


def group(name: str, *tasks: Task) -> Collection:
    """A named collection of tasks (`images.build`); its name is in its tasks' config, for their help."""
    collection = Collection(name, *tasks)
    collection.configure({CONFIG_KEY: {"group": name}})
    return collection


# --- help ---------------------------------------------------------------------------------------------------------


def usage_line(cmd: Task, name: str, binary: str = "invoke") -> str:
    """`Usage: invoke compare [--options] BASE CANDIDATE`: the positional arguments in order, as typed."""
    table = getattr(cmd, "table", None)
    positional = [r.flag for r in table if r.positional] if table else [p.upper() for p in cmd.positional]
    variadic = getattr(cmd, "variadic", None)
    more = f" [{variadic.upper()}…]" if variadic else ""
    opts = " [--options]" if table is None or any(not r.positional for r in table) else ""
    return f"Usage: {binary} {name}{opts}{''.join(' ' + p for p in positional)}{more}"


def option_rows(cmd: Task) -> list[tuple[str, str]]:
    """(flag with its value, help with its type and default) for each option of `cmd`, positionals first."""
    table: OptionTable = cmd.table  # type: ignore[attr-defined]
    source, value_of = _resolved_defaults(cmd)
    rows = []
    for row in sorted(table, key=lambda r: not r.positional):
        spec = row.flag if row.kind is bool or row.positional else f"{row.flag}={row.value_name}"
        facts = [row.type_text()]
        if row.positional or row.required:
            facts.append("required")
        elif row.field is not None and value_of is not None:
            facts.append(f"default: {_shown(value_of(row.field))} ({source})")
        elif row.kind is not bool and not row.repeatable:
            facts.append(f"default: {row.default_text or _shown(row.default)}")
        facts = [f for f in facts if f]
        rows.append((spec, row.help + (f" [{'; '.join(facts)}]" if facts else "")))
    return rows


def _resolved_defaults(cmd: Task) -> tuple[str, Callable[[str], Any] | None]:
    defaults = getattr(cmd, "defaults", None)
    if defaults is None:
        return "", None
    try:
        return defaults()
    except UserError:  # a broken preset: the help still prints, without the preset's values
        return "", None


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def help_text(cmd: Task, name: str, binary: str = "invoke", width: int | None = None) -> str:
    """A task's help: its usage line, its docstring, then each option with its type and default."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    lines = [usage_line(cmd, name, binary), ""]
    doc = inspect.getdoc(cmd) or ""
    lines += [textwrap.indent(doc, "  "), ""] if doc else []
    rows = option_rows(cmd) if getattr(cmd, "table", None) is not None else []
    if rows:
        lines.append("Options:")
        spec_width = min(max(len(s) for s, _ in rows), 34)
        for spec, text in rows:
            wrapped = textwrap.wrap(text, max(width - spec_width - 6, 30), break_on_hyphens=False) or [""]
            if len(spec) > spec_width:
                lines.append(f"  {spec}")
                lines += [f"  {'':{spec_width}}  {w}" for w in wrapped]
            else:
                lines.append(f"  {spec:{spec_width}}  {wrapped[0]}")
                lines += [f"  {'':{spec_width}}  {w}" for w in wrapped[1:]]
    else:
        lines.append("Options: none")
    return "\n".join(lines)


def preset_values(config: Any) -> Callable[[str], Any]:
    """A dotted field's value in a frozen config tree (`head.capture` → config.head.capture)."""

    def value(dotted: str) -> Any:
        node = config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
        return node

    return value
