"""The option tables (`core.options`): each benchmark and pipeline option written once, and everything made from it.

- A row added to a copy of a table shows in the task's help, the parsed values, the config overrides and the schema,
  with no other edit (acceptance 1 of "A smaller surface").
- The committed schemas hold exactly the tables' fragments; run this file as a script to rewrite them after a
  table changed: `python tests/unit/cli/test_option_tables.py`.
- Each flag is spelled in one table only: no other source file spells a table's flag outside an error's text.
- Hostile values (hypothesis): every table row either parses a value into its kind, within its bounds, or refuses
  it with one line naming its flag; an integer row agrees with Python's own int() on what is an integer.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from draftscope.bench.options import BENCHMARK, PLAN
from draftscope.cli.command import Command, help_text
from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable
from draftscope.core.resources import schemas_dir
from draftscope.core.schema import get_schema
from draftscope.pipeline.options import PIPELINE

ROOT = Path(__file__).resolve().parents[3]
TABLES = {"experiment": BENCHMARK, "pipeline-config": PIPELINE}


def _task(table: OptionTable) -> Command:
    def body(c, **values):
        return values

    body.__doc__ = "A task made from a table.\n\nIts help lists the table's rows."
    return Command(body, table=table, name="probe")


def test_a_row_added_to_a_copy_shows_in_help_parsing_overrides_and_schema():
    row = Option("max_widgets", "widgets per request", kind=int, field="head.widgets", minimum=1, maximum=9)
    table = OptionTable.of(BENCHMARK, row)
    task = _task(table)
    assert "--max-widgets=INT" in help_text(
        task, "probe"
    ) and "widgets per request [integer 1–9;" in " ".join(help_text(task, "probe").split())
    assert "max-widgets" in [n for a in task.get_arguments() for n in a.names]
    _, parsed = task.checked_values((), {"max_widgets": "3"})
    assert parsed["max_widgets"] == 3
    assert table.overrides(parsed) == {"head": {"widgets": 3}}
    schema = table.apply_schema(get_schema("experiment"))
    assert schema["properties"]["head"]["properties"]["widgets"] == row.fragment()
    Draft202012Validator.check_schema(schema)
    with pytest.raises(UserError, match=r"--max-widgets: must be at most 9 \(got '10'\)"):
        task.checked_values((), {"max_widgets": "10"})
    assert "max_widgets" not in BENCHMARK  # the table itself is unchanged


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_committed_schema_holds_the_tables_fragments(name):
    assert TABLES[name].apply_schema(get_schema(name)) == get_schema(name), (
        f"schemas/{name}.schema.json differs from its option table; run python tests/unit/cli/test_option_tables.py"
    )


def test_each_flag_is_spelled_in_one_table_only():
    """No option is declared (`Option("name", …)`) in two places, and no command declares one of the tables' options
    the plain way (a help dict): a command takes a row from its table (`only`, `changed`)."""
    src = ROOT / "src" / "draftscope"
    declared: dict[str, list[str]] = {}
    for path in src.rglob("*.py"):
        for name in re.findall(r'\bOption\(\s*"(\w+)"', path.read_text()):
            declared.setdefault(name, []).append(str(path.relative_to(src)))
    names = {r.name for table in (BENCHMARK, PIPELINE) for r in table}
    twice = {n: homes for n, homes in declared.items() if n in names and len(homes) > 1}
    # One name, two quantities, kept as they were: the benchmark's --draft is a draft model (OWNER/NAME or tiny), the
    # pipeline's the draft architecture it trains (dflash, dflash2, dspark).
    assert twice == {"draft": ["bench/options.py", "pipeline/options.py"]} or twice == {
        "draft": ["pipeline/options.py", "bench/options.py"]
    }
    assert all(n in declared for n in names)
    help_dict = re.compile(r'"(' + "|".join(sorted(names)) + r')": "')
    for path in (src / "cli" / "bench.py", src / "cli" / "pipeline.py"):
        assert not help_dict.search(path.read_text()), f"{path}: a help dict for a table's option"


def test_plan_takes_the_benchmarks_rows():
    for name in ("prompts", "dataset", "max_prompts", "opts"):
        assert PLAN[name] == BENCHMARK[name]
    assert PLAN["experiment"].repeatable and not BENCHMARK["experiment"].repeatable


ROWS = [row for table in (BENCHMARK, PIPELINE) for row in table if not row.repeatable]


@settings(max_examples=300, deadline=None)
@given(
    row=st.sampled_from(ROWS),
    text=st.one_of(st.text(max_size=30), st.integers().map(str), st.floats().map(str)),
)
def test_every_row_parses_or_refuses_with_its_flag(row, text):
    raw = True if row.kind is bool else text
    try:
        value = row.parse(raw)
    except UserError as exc:
        assert exc.field == row.flag and "\n" not in exc.render()
        return
    if row.kind is bool:
        assert value is True
        return
    assert isinstance(value, row.kind)
    if row.kind is int:
        assert value == int(text.strip())
    if row.allowed:
        assert value in row.allowed
    for bound, ok in ((row.minimum, lambda v, b: v >= b), (row.maximum, lambda v, b: v <= b)):
        if bound is not None:
            assert ok(value, bound)
    if row.above is not None:
        assert value > row.above


def write() -> None:
    for name, table in TABLES.items():
        path = schemas_dir() / f"{name}.schema.json"
        path.write_text(json.dumps(table.apply_schema(get_schema(name)), indent=2, ensure_ascii=False) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(write())
