"""`read_submitted`: a Slurm job file read on a compute node, refused clearly when unreadable or from another kit."""

from __future__ import annotations

import json

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_submitted


def read(path, **kind):
    return read_submitted(path, what="plan", folder="workdir", schema_version=1, **kind)


def test_a_job_file_of_this_kit_is_read(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"schema_version": 1, "kind": "benchmark", "x": [1]}))
    assert read(path)["x"] == [1] and read(path, kind="benchmark")["kind"] == "benchmark"


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        (None, "cannot read the submitted plan"),
        ("{not json", "cannot read the submitted plan"),
        ("[1, 2]", "not a plan file of this kit version"),
        ('{"schema_version": 2}', "not a plan file of this kit version"),
        ('{"schema_version": 1, "kind": "pipeline"}', "not a plan file of this kit version"),
    ],
)
def test_an_unreadable_or_foreign_job_file_is_one_clear_error(tmp_path, content, phrase):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as err:
        read(path, kind="benchmark")
    assert phrase in str(err.value) and err.value.source == str(path) and "resubmit" in err.value.fix
