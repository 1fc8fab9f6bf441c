"""kick.json (`make kick-the-tires`): a row per claim of the kit's own research/claims.yaml, checked against
schemas/kick.schema.json before it is written, and written whole (atomically) or not at all."""

from __future__ import annotations

import json

import pytest

from draftscope.core.errors import UserError
from draftscope.ops import claims as C
from draftscope.ops.kick import _row, table, write_summary

from support import ROOT

VERDICTS = ("reproduced", "not_reproduced", "needs_hardware", "not_checkable", "failed")


def _rows():
    rows = []
    for i, claim in enumerate(C.load_claims(ROOT)):
        verdict = None if i % 6 == 5 else {"verdict": VERDICTS[i % 5], "reason": f"reason {i}"}
        rows.append(_row(claim, verdict, 0 if verdict else 3, 1.25 * i))
    return rows


def test_every_claims_row_is_valid_and_the_file_reads_back(tmp_path):
    rows = _rows()
    assert rows, "research/claims.yaml holds claims"
    path = write_summary(tmp_path, "20261204T230000Z", 12.34, rows)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "kick-the-tires" and doc["schema_version"] == 1 and doc["seconds"] == 12.3
    assert doc["claims"] == rows
    assert len(table(rows)) == len(rows) + 3  # header, rule, a line per claim, the tally
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kick.json"]  # no temporary file left


@pytest.mark.parametrize(
    "field, value, where",
    [
        ("verdict", "maybe", "$.claims[0].verdict"),
        ("seconds", -1, "$.claims[0].seconds"),
        ("claim", "", "$.claims[0].claim"),
    ],
)
def test_a_bad_row_is_refused_naming_its_path_and_nothing_is_written(tmp_path, field, value, where):
    rows = _rows()
    rows[0] = {**rows[0], field: value}
    with pytest.raises(UserError) as caught:
        write_summary(tmp_path, "20261204T230000Z", 1.0, rows)
    line = caught.value.render()
    assert where in line and "kick.json" in line and "\n" not in line, line
    assert list(tmp_path.iterdir()) == []
