"""The `draftscope` command: invoke's `Program` over the kit's tasks, reading two things invoke's parser does not.

invoke's parser gives a task exactly its declared positionals, reads the next bare word as a task name, and gives a
missing positional whatever word comes next. So this Program rewrites the task words before they are parsed
(`normalize_argv`, invoke's hook for the argv it parses):

- `draftscope analyze A B C` → `analyze A --run B --run C`: words past a task's positionals go to the repeatable
  option its `@command(variadic=…)` names (`invoke analyze A --run B --run C` is the same, typed out);
- `draftscope TASK … --help` (or `-h`) → `draftscope --help TASK`: help, also for a task whose positional was not
  given yet.

Nothing else changes: a word that names no task or option passes as typed, and invoke reports it.
"""

from __future__ import annotations

import copy

from invoke import Collection, Exit, Program
from invoke.parser import Argument, ParseError, ParserContext

from draftscope.cli.command import HELP_WORDS
from draftscope.cli.doctor import version_text
from draftscope.core.provenance import kit_info


class DraftscopeProgram(Program):
    def print_version(self) -> None:
        # The commit too, from a checkout (kit_info runs git only then), and only when asked.
        print(f"{self.name} {version_text(kit_info())}")

    def parse_tasks(self) -> None:
        # invoke prints its parser's complaints as they are ("No idea what 'x' is!"): the kit's one line is `error:`.
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(f"error: {exc}", code=1) from None

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
