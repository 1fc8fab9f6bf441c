"""`Figures`: generated bad inputs counted apart from the named corpus, their bounds, their line and JSON."""

from __future__ import annotations

import pytest

from draftscope.ops import reliability as R
from draftscope.ops.reliability import Figures


def full(**extra) -> Figures:
    """A tally that meets every bound."""
    f = Figures(seed=1)
    for i in range(R.MIN_FAULTS):
        with f.fault(R.STEP_KINDS[i % len(R.STEP_KINDS)], f"kill {i}"):
            pass
    for i in range(R.MIN_BAD_INPUTS):
        f.bad_input(f"named-{i}", True)
    for i in range(R.MIN_GENERATED):
        f.generated_case(f"task{i % R.MIN_GENERATED_TASKS}", "opt", "refused" if i % 3 else "accepted")
    for key, value in extra.items():
        setattr(f, key, value)
    return f


def test_a_full_tally_meets_every_bound():
    assert full().shortfalls() == []


@pytest.mark.parametrize("outcome", ["traceback", "hang", "wrote", "unclean", "canary"])
def test_any_broken_generated_case_is_a_shortfall(outcome):
    f = full()
    f.generated_case("benchmark", "output", outcome)
    assert f.shortfalls() == [f"1 generated bad input(s) ended: {outcome}"]


def test_too_few_generated_cases_or_commands_is_a_shortfall():
    f = full()
    f.generated = f.generated[: R.MIN_GENERATED - 1]
    assert any("generated bad inputs, fewer than" in s for s in f.shortfalls())
    f = full()
    for case in f.generated:
        case.task = "one"
    assert any("generated bad inputs for 1 commands" in s for s in f.shortfalls())


def test_an_unknown_outcome_is_refused():
    with pytest.raises(ValueError, match="unknown outcome"):
        Figures().generated_case("t", "o", "fine")


def test_named_and_generated_are_printed_apart():
    f = full()
    f.generated_case("benchmark", "output", "hang")
    lines = "\n".join(f.lines())
    assert (
        f"bad inputs tried / refused cleanly (named corpus): {R.MIN_BAD_INPUTS} / {R.MIN_BAD_INPUTS}" in lines
    )
    refused = sum(c.outcome == "refused" for c in f.generated)
    accepted = sum(c.outcome == "accepted" for c in f.generated)
    assert (
        f"tried / refused cleanly / accepted cleanly / tracebacks / hangs / wrote on refusal: "
        f"{R.MIN_GENERATED + 1} / {refused} / {accepted} / 0 / 1 / 0" in lines
    )


def test_generated_cases_survive_the_json_round_trip(tmp_path):
    import json

    f = full()
    f.generated_case("plan", "opts", "traceback")
    f.write(tmp_path / "figures.json")
    back = Figures.from_dict(json.loads((tmp_path / "figures.json").read_text()))
    assert back.generated == f.generated
    assert back.generated_counts()["traceback"] == 1
    assert Figures.from_dict({}).generated == []  # figures written before generated cases existed


def test_worker_tallies_merge_into_the_whole_one():
    whole = full(secret_hits=0, files_searched=7)
    with whole.fault("train", "lost one") as fault:
        fault.lose(1)
    with whole.rerun("regen", "resume") as rerun:
        rerun.tear(2)
    # split every list at a different point, as two xdist workers would
    halves = [Figures(seed=1), Figures(seed=1)]
    for name in ("faults", "reruns", "bad_inputs", "generated"):
        items = getattr(whole, name)
        cut = len(items) // 3
        setattr(halves[0], name, items[:cut])
        setattr(halves[1], name, items[cut:])
    halves[0].files_searched, halves[1].files_searched = 3, 4
    merged = Figures.merged([Figures.from_dict(h.to_dict()) for h in halves])
    assert merged.lines() == whole.lines()
    assert merged.shortfalls() == whole.shortfalls() != []
    assert Figures.merged([]).lines() == Figures().lines()


def test_tallies_of_different_seeds_are_not_merged():
    with pytest.raises(ValueError, match="different seeds"):
        Figures.merged([Figures(seed=1), Figures(seed=2)])
