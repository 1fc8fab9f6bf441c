"""docs/use/commands.md holds every task's help as the tasks print it (`cli.reference`): regenerated here, and the
committed page must equal it. After changing a task or an option table: `python tests/unit/docs/test_commands_page.py`."""

from __future__ import annotations

import sys
from pathlib import Path

from draftscope.cli import GROUPS, ns
from draftscope.cli.reference import reference, replace_generated

PAGE = Path(__file__).resolve().parents[3] / "docs" / "use" / "commands.md"


def _expected() -> str:
    return replace_generated(PAGE.read_text(), reference(ns, GROUPS))


def test_the_commands_page_is_the_tasks_help():
    assert PAGE.read_text() == _expected(), (
        "docs/use/commands.md is stale: python tests/unit/docs/test_commands_page.py"
    )


def test_every_task_is_in_one_group():
    listed = [n for names in GROUPS.values() for n in names]
    assert sorted(listed) == sorted(ns.task_names), set(listed) ^ set(ns.task_names)


def test_every_summary_fits_the_task_list():
    from draftscope.cli.program import SUMMARY_WIDTH, summary

    long = {n: summary(ns[n]) for n in ns.task_names if len(summary(ns[n])) > SUMMARY_WIDTH}
    assert not long


if __name__ == "__main__":
    PAGE.write_text(_expected())
    sys.exit(0)
