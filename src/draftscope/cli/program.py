"""The `draftscope` command: invoke's `Program` over the kit's tasks, reading two things invoke's parser does not.

invoke's parser gives a task exactly its declared positionals, reads the next bare word as a task name, and gives a
missing positional whatever word comes next. So this Program rewrites the task words before they are parsed
(`normalize_argv`, invoke's hook for the argv it parses):

- `draftscope analyze A B C` → `analyze A --run B --run C`: words past a task's positionals go to the repeatable
  option its `@command(variadic=…)` names (`invoke analyze A --run B --run C` is the same, typed out);
- `draftscope TASK … --help` (or `-h`) → `draftscope --help TASK`: help, also for a task whose positional was not
  given yet.

Nothing else changes: a word that names no task or option passes as typed, and the parser reports it — in one
`error:` line with the nearest task or option (`explain`), or the option a retired short flag stood for.

The help is the kit's (`cli.command.help_text`: the usage line with the positional arguments, each option's type and
default), and the task list is grouped by what the tasks are for (`GROUPS` in `cli`, each task's first docstring
line, which fits a line). A checkout's `invoke` hands its command line to this Program too (tasks.py), so both
names answer alike.
"""

from __future__ import annotations

import ast
import copy
import difflib
import inspect
import re
import textwrap
from collections.abc import Mapping, Sequence

from invoke import Collection, Exit, Program
from invoke.parser import Argument, ParseError, ParserContext

from draftscope.cli.command import HELP_WORDS, help_text
from draftscope.cli.doctor import version_text
from draftscope.core.provenance import kit_info

SUMMARY_WIDTH = 72  # a task's one-line description in the list (tests/unit/cli: every task's fits)


class DraftscopeProgram(Program):
    """invoke's Program with the kit's help, task list and parse errors; `groups` sorts the task list."""

    def __init__(
        self, *args: object, groups: Mapping[str, Sequence[str]] | None = None, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.groups = dict(groups or {})

    def print_version(self) -> None:
        # The commit too, from a checkout (kit_info runs git only then), and only when asked.
        print(f"{self.name} {version_text(kit_info())}")

    def parse_tasks(self) -> None:
        # invoke prints its parser's complaints as they are ("No idea what 'x' is!"): the kit's one line is `error:`.
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(f"error: {explain(exc, self.collection, self.binary)}", code=1) from None

    def print_task_help(self, name: str) -> None:
        print(help_text(self.collection[name], name, self.binary))

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--core-opts] TASK [--options] [other tasks here ...]")
        print(f"       {self.binary} TASK --help    (a task's options, their types and defaults)")
        print()
        self.list_tasks()
        core = ", ".join(sorted(n for n in self.initial_context.flags if n.startswith("--")))
        print("Core options (invoke's):")
        print("  " + "\n  ".join(textwrap.wrap(core, SUMMARY_WIDTH + 20)))

    def list_tasks(self) -> None:
        if self.list_format != "flat" or self.list_root or not self.groups:
            super().list_tasks()
            return
        print(task_listing(self.collection, self.groups))

    def normalize_argv(self, argv: list[str] | str | None) -> None:
        # invoke's hook for the argv it is about to parse: the task words (after invoke's own options, before
        # `--`) are rewritten here, and a request for a task's help becomes `--help TASK`, invoke's own form.
        super().normalize_argv(argv)
        program, words = self.argv[:1], list(self.argv[1:])
        start = _task_start(words, self.initial_context)
        end = start + words[start:].index("--") if "--" in words[start:] else len(words)
        tasks, help_for = rewrite(words[start:end], self.namespace)
        if help_for is not None:
            self.argv = [*program, *words[:start], "--help", help_for]
        else:
            self.argv = [*program, *words[:start], *tasks, *words[end:]]


def _task_start(words: list[str], core: ParserContext) -> int:
    """Where the task words begin: after invoke's own options and their values."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        flag = words[i].split("=", 1)[0]
        i += 2 if "=" not in words[i] and flag in core.flags and _takes_value(core.flags[flag]) else 1
    return i


def rewrite(words: list[str], namespace: Collection) -> tuple[list[str], str | None]:
    """The task words with extra positionals moved into their task's variadic option, and the task whose help was
    asked for (None if none)."""
    contexts: dict[str, ParserContext] = {}
    # A copy: invoke's Task.get_arguments() uses up the task's help strings, and the real parse comes after this.
    for ctx in copy.deepcopy(namespace).to_contexts():
        for name in (ctx.name, *ctx.aliases):
            contexts[name] = ctx
    out: list[str] = []
    ctx: ParserContext | None = None
    given = 0  # positionals given to the current task
    value_next = False  # the previous word was an option that takes a value
    for word in words:
        if value_next:
            out.append(word)
            value_next = False
        elif ctx is None or (given >= len(ctx.positional_args) and word in contexts):
            ctx, given = contexts.get(word), 0
            out.append(word)
        elif word in HELP_WORDS and word not in ctx.flags:
            return out, ctx.name
        elif word.startswith("-"):
            flag, inline = word.split("=", 1)[0], "=" in word
            # `in` and [] (not .get) on the flags: a Lexicon finds short flags through its aliases only so.
            value_next = not inline and flag in ctx.flags and _takes_value(ctx.flags[flag])
            out.append(word)
        elif given < len(ctx.positional_args):
            given += 1
            out.append(word)
        elif variadic := getattr(namespace[ctx.name], "variadic", None):
            out += [f"--{variadic.replace('_', '-')}", word]
        else:
            out.append(word)
    return out, None


def _takes_value(arg: Argument) -> bool:
    return arg.takes_value and not arg.optional


def summary(task: object) -> str:
    """A task's first docstring line: its description in the task list."""
    doc = inspect.getdoc(task) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def task_listing(collection: Collection, groups: Mapping[str, Sequence[str]]) -> str:
    """The tasks under their group's heading, each with its one-line description."""
    names = {*collection.task_names}
    listed = [n for members in groups.values() for n in members]
    rest = sorted(names - set(listed))
    sections = [(group, members) for group, members in groups.items()] + ([("other", rest)] if rest else [])
    width = max(len(n) for n in names) + 2
    lines = ["Tasks (TASK --help shows a task's options):"]
    for group, members in sections:
        lines += ["", f"  {group}:"]
        lines += [f"    {n:{width}}{summary(collection[n])}" for n in members if n in names]
    return "\n".join(lines) + "\n"


_NO_IDEA = re.compile(r"No idea what (.+) is!")


def explain(exc: ParseError, collection: Collection, binary: str = "invoke") -> str:
    """invoke's parse error as one line with the nearest task or option, or the option a retired short flag was."""
    found = _NO_IDEA.fullmatch(str(exc))
    if found is None:
        return str(exc)
    try:
        word = str(ast.literal_eval(found.group(1)))
    except (ValueError, SyntaxError):
        word = found.group(1).strip("'\"")
    ctx = exc.context
    task = ctx.name if ctx is not None and ctx.name in collection.task_names else None
    if word.startswith("-") and task is not None:
        return _unknown_option(word.split("=", 1)[0], task, ctx, collection, binary)
    if word.startswith("-"):
        near = difflib.get_close_matches(word, [f for f in _flags(ctx) if f.startswith("--")], n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        return f"no such option {word!r}{hint} ({binary} --help lists the core options and the tasks)"
    near = difflib.get_close_matches(word, list(collection.task_names), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    after = f" (and {task} takes no more arguments)" if task else ""
    return f"no task named {word!r}{after}{hint} ({binary} --list lists them)"


def _unknown_option(flag: str, task: str, ctx: ParserContext, collection: Collection, binary: str) -> str:
    legacy = getattr(collection[task], "legacy_short_flags", dict)()
    if flag in legacy:
        return (
            f"{task}: the kit has no short flags; {flag} was {legacy[flag]}, write that ({binary} {task} --help "
            "lists the options)"
        )
    near = difflib.get_close_matches(flag, [f for f in _flags(ctx) if f.startswith("--")], n=1, cutoff=0.5)
    hint = f"; did you mean {near[0]}?" if near else ""
    return f"{task} has no option {flag}{hint} ({binary} {task} --help lists them)"


def _flags(ctx: ParserContext | None) -> list[str]:
    return list(ctx.flags) if ctx is not None else []
