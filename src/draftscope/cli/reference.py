"""The command reference page (docs/use/commands.md, between its `generated` markers), made from the tasks
themselves: each group's tasks with the help `TASK --help` prints (usage line, summary, options with their types
and defaults). tests/unit/docs/test_commands_page.py regenerates it and fails when the committed page differs."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from invoke import Collection

from draftscope.cli.command import help_text

BEGIN = "<!-- generated: the tasks' help (tests/unit/docs/test_commands_page.py rewrites it) -->"
END = "<!-- end of the generated part -->"
WIDTH = 110


def reference(collection: Collection, groups: Mapping[str, Sequence[str]]) -> str:
    """The generated part: a heading per group, and per task its summary and its help as `invoke TASK --help`."""
    out = [BEGIN, ""]
    for group, names in groups.items():
        out += [f"### {group}", ""]
        for name in names:
            task = collection[name]
            summary = (inspect.getdoc(task) or "").splitlines()[0]
            out += [
                f"#### `{name}`",
                "",
                summary,
                "",
                "```text",
                help_text(task, name, "invoke", WIDTH),
                "```",
                "",
            ]
    out.append(END)
    return "\n".join(out)


def replace_generated(page: str, generated: str) -> str:
    """`page` with its generated part (BEGIN … END) replaced."""
    if BEGIN not in page or END not in page:
        raise ValueError("the page has no generated part")  # a bug in the page, not user input
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + generated + tail
