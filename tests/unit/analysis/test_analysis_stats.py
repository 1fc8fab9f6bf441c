"""Paired statistics and `compare` on synthetic runs: the verdict, the A/A case, joins, token checks, the file."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_analysis_synthetic import PROMPTS, make_run

from draftscope.analysis import stats
from draftscope.analysis.compare import (
    compare_runs,
    default_output,
    divergence,
    summary_lines,
    write_comparison,
)
from draftscope.analysis.load import load_run
from draftscope.core import schema
from draftscope.core.errors import UserError

PROMPTS_TEXT = PROMPTS.read_text()


def test_bootstrap_is_seeded_and_brackets_the_median():
    values = [0.97, 1.01, 0.99, 1.02, 0.98, 1.00, 1.03, 0.96]
    a = stats.bootstrap_median_ci(values, resamples=2000, seed=7)
    b = stats.bootstrap_median_ci(values, resamples=2000, seed=7)
    assert a == b
    assert a.low <= sorted(values)[len(values) // 2] <= a.high


def test_bootstrap_edge_cases():
    assert stats.bootstrap_median_ci([1.0], resamples=100, seed=0) is None
    assert stats.bootstrap_median_ci([0.9, 0.9, 0.9], resamples=100, seed=0) == stats.Interval(0.9, 0.9)


@pytest.mark.parametrize(
    ("low", "high", "band", "decision"),
    [
        (0.95, 0.985, None, "admitted"),
        (0.95, 0.99, None, "not_admitted"),  # touching the limit does not clear it
        (0.98, 1.01, None, "not_admitted"),
        (0.95, 0.985, 0.02, "not_admitted"),  # clears 1% but lies inside the A/A noise
        (0.90, 0.95, 0.02, "admitted"),
    ],
)
def test_admission_needs_the_whole_interval_below_the_limit(low, high, band, decision):
    noise = {"half_width": band} if band is not None else None
    verdict = stats.admission(stats.Interval(low, high), 0.01, 0.95, noise)
    assert verdict["decision"] == decision, verdict["reason"]


def test_admission_without_an_interval_is_not_admitted():
    assert stats.admission(None, 0.01, 0.95, None)["decision"] == "not_admitted"


@pytest.mark.parametrize(("text", "value"), [("1%", 0.01), ("0.5%", 0.005), ("0.02", 0.02), (" 2 % ", 0.02)])
def test_parse_threshold(text, value):
    assert stats.parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["1", "abc", "-1%", "100%"])
def test_parse_threshold_refuses(text):
    with pytest.raises(UserError, match="--threshold"):
        stats.parse_threshold(text)


def test_split_halves_is_earlier_vs_later():
    assert stats.split_halves([0]) is None
    assert stats.split_halves([1, 0]) == ([0], [1])
    assert stats.split_halves([0, 1, 2, 3, 4]) == ([0, 1], [2, 3, 4])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=12), st.integers(0, 2**32 - 1))
def test_the_interval_always_contains_the_sample_median_range(values, seed):
    ci = stats.bootstrap_median_ci(values, resamples=200, seed=seed)
    assert min(values) - 1e-12 <= ci.low <= ci.high <= max(values) + 1e-12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmp")
    return {
        "a": load_run(make_run(folder / "a", repeats=4, seed=1)),
        "a2": load_run(make_run(folder / "a2", repeats=4, seed=2)),
        "fast": load_run(make_run(folder / "fast", repeats=4, seed=3, speed=0.9)),
        "subset": load_run(make_run(folder / "subset", seed=4, skip=("code-sql", "math-arith"))),
        "changed": load_run(make_run(folder / "changed", seed=5, change_token=("prose-story", 5))),
        "one": load_run(make_run(folder / "one", repeats=1, seed=6)),
    }


def test_an_a_a_comparison_is_not_admitted_and_is_schema_valid(runs):
    doc = compare_runs(runs["a"], runs["a2"], threshold=0.01, resamples=2000, seed=0)
    assert schema.problems(doc, "comparison") == []
    assert doc["verdict"]["decision"] == "not_admitted"
    assert doc["ci"]["low"] < 1.0 < doc["ci"]["high"]
    assert doc["noise_band"]["halves"] == [[0, 1], [2, 3]] and doc["noise_band"]["half_width"] > 0
    assert doc["tokens"]["expected_identical"] and doc["tokens"]["first_mismatch"] is None
    assert doc["tokens"]["compared"] == doc["tokens"]["identical"] == 48


def test_a_clearly_faster_candidate_is_admitted(runs):
    doc = compare_runs(runs["a"], runs["fast"], threshold=0.01, resamples=2000, seed=0)
    assert doc["verdict"]["decision"] == "admitted", doc["verdict"]["reason"]
    assert doc["ci"]["high"] < 0.99 and doc["median_ratio"] == pytest.approx(0.9, abs=0.03)
    assert doc["throughput"]["request_tok_s"]["ratio"] > 1.05


def test_the_same_seed_gives_the_same_interval(runs):
    one = compare_runs(runs["a"], runs["fast"], threshold=0.01, resamples=500, seed=3)
    two = compare_runs(runs["a"], runs["fast"], threshold=0.01, resamples=500, seed=3)
    assert one["ci"] == two["ci"]


def test_differing_prompt_sets_are_refused_naming_the_missing_prompts(runs):
    with pytest.raises(UserError) as info:
        compare_runs(runs["a"], runs["subset"], threshold=0.01, resamples=100)
    text = info.value.render()
    assert "code-sql" in text and "math-arith" in text and "--allow-subset" in text
    assert "\n" not in text
    doc = compare_runs(runs["a"], runs["subset"], threshold=0.01, resamples=100, allow_subset=True)
    assert doc["prompts"]["joined"] == 10
    assert doc["prompts"]["missing_in_candidate"] == ["code-sql", "math-arith"]


def test_a_token_mismatch_names_the_prompt_and_position(runs):
    doc = compare_runs(runs["a"], runs["changed"], threshold=0.01, resamples=100)
    first = doc["tokens"]["first_mismatch"]
    assert first == {"prompt_id": "prose-story", "base_repeat": 0, "candidate_repeat": 0, "position": 5}
    assert len(doc["tokens"]["mismatches"]) == 2


def test_per_prompt_agreement_and_first_divergence_are_reported_and_printed(runs):
    doc = compare_runs(runs["a"], runs["changed"], threshold=0.01, resamples=100)
    assert schema.problems(doc, "comparison") == []
    rows = {row["prompt_id"]: row for row in doc["tokens"]["per_prompt"]}
    assert len(rows) == doc["prompts"]["joined"]
    assert rows["prose-story"] == {
        "prompt_id": "prose-story",
        "compared": 2,
        "identical": 0,
        "first_divergence": 5,
    }
    assert all(
        r["identical"] == r["compared"] and r["first_divergence"] is None
        for p, r in rows.items()
        if p != "prose-story"
    )
    lines = summary_lines(doc)
    assert "    prose-story: 0/2 identical, first divergence at position 5" in lines
    assert "    code-sql: 2/2 identical" in lines


def test_no_noise_band_with_one_repeat(runs):
    doc = compare_runs(runs["one"], runs["a"], threshold=0.01, resamples=100)
    assert doc["noise_band"] is None and any("fewer than two repeats" in n for n in doc["notes"])


def test_a_speculative_candidate_must_still_agree(tmp_path, runs):
    spec = load_run(make_run(tmp_path / "spec", draft=True, seed=9))
    doc = compare_runs(runs["a"], spec, threshold=0.01, resamples=100)
    assert doc["tokens"]["expected_identical"] is True and doc["tokens"]["first_mismatch"] is None


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (([1, 2, 3], "length"), ([1, 2, 3, 4], "length"), None),  # a shorter limit is a prefix
        (([1, 2, 3], "eos"), ([1, 2, 3, 4], "length"), 3),  # one stopped where the other went on
        (([1, 2, 3], "eos"), ([1, 2, 3], "eos"), None),
        (([1, 9, 3], "length"), ([1, 2, 3], "length"), 1),
    ],
)
def test_divergence(a, b, expected):
    rec = lambda ids, why: {"generated_token_ids": ids, "finish_reason": why}  # noqa: E731
    assert divergence(rec(*a), rec(*b)) == expected


def test_write_comparison_is_exclusive_and_validated(tmp_path, runs):
    doc = compare_runs(runs["a"], runs["a2"], threshold=0.01, resamples=100)
    path = write_comparison(doc, tmp_path / "c.json")
    saved = json.loads(path.read_text())
    assert schema.problems(saved, "comparison") == [] and saved["figure"] == "c.png"
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = path.read_bytes()
    with pytest.raises(UserError, match="already exists"):
        write_comparison(dict(doc), tmp_path / "c.json")
    assert path.read_bytes() == before
    assert default_output(runs["a"], runs["a2"]).as_posix() == "comparisons/a__a2.json"


def test_compare_with_a_study_uses_its_frozen_rule_and_inputs(tmp_path):
    from test_analysis_report import cli

    a, b = make_run(tmp_path / "a", seed=1), make_run(tmp_path / "b", seed=2)
    out = tmp_path / "c.json"
    result = cli("compare", str(a), str(b), "--study", "tiny-cpu-aa", "--output", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["study"] == "tiny-cpu-aa" and doc["threshold"] == 0.01 and doc["resamples"] == 10000
    refused = cli("compare", str(a), str(b), "--study", "tiny-cpu-aa", "--threshold", "5%")
    assert refused.returncode == 2 and "freezes the threshold" in refused.stderr
    other = tmp_path / "other.json"
    other.write_text(PROMPTS_TEXT.replace("linked list", "linked-list", 1))
    c = make_run(tmp_path / "c", seed=3, prompts_file=other)
    refused = cli("compare", str(a), str(c), "--study", "tiny-cpu-aa", "--allow-subset")
    assert refused.returncode == 2 and "not the study's frozen" in refused.stderr
