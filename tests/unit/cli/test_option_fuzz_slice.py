"""The fast slice of the generated option fuzzing (tests/reliability/test_fuzz_options.py, `invoke reliability`):
one hostile value of each option's kind, for every option of every command, in-process. Seconds, so that a new
option that tracebacks on a bad value fails `make test` too, not only the reliability tier."""

from __future__ import annotations

import importlib

import pytest

from draftscope.cli import ns

from support import ROOT

F = importlib.import_module("reliability.optfuzz")  # tests/reliability/optfuzz.py (tests/ is on the path)

# One value per kind that took a traceback somewhere before #18's fixes.
ONE = {
    F.PATH: "x" * 10_000,
    F.NUMBER: "nan",
    F.CHOICE: "-x",
    F.CSV: "1,,2",
    F.TEXT: "\udcff",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from test_analysis_synthetic import make_run  # tests/unit/analysis, on the path (tests/conftest.py)

    fixtures = tmp_path_factory.mktemp("slice-fixtures")
    run, run2 = make_run(fixtures / "run-a"), make_run(fixtures / "run-b", seed=1)
    prompts = fixtures / "prompts.json"
    prompts.write_bytes((ROOT / "examples" / "prompts.json").read_bytes())
    world = F.World(fixtures, tmp_path_factory.mktemp("slice-cases"), run, run2, prompts)
    F.warm(world)
    return world


def test_one_hostile_value_per_option_breaks_nothing(world):
    broken = []
    pairs = [(t, o) for t in sorted(ns.task_names) for o in F.options(t)]
    for task, option in pairs:
        case = F.run_case(world, task, option, (ONE[F.KINDS[option]],))
        if not case.ok:
            broken.append(case.describe())
    assert len(pairs) > 80
    assert not broken, "\n".join(broken)
