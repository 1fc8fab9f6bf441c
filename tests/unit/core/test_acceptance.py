"""The acceptance ledger (issue 20, acceptance 2): every definition proved on hand-computed fixtures, per backend.

Fixtures (tests/fixtures/acceptance/), with the arithmetic done by hand:

kit's loop, k = 3 — request a: L = [4, 1, 2] → E = 7, N = 3, a = (3, 0, 1), A = 4, P = 9, mean 7/3;
                    request b: L = [1, 3]    → E = 4, N = 2, a = (0, 2),    A = 2, P = 6, mean 2;
                    record c has no acceptance fields and is left out.
  pooled          = (7 + 4) / (3 + 2)                 = 11/5  = 2.2
  per-request     = (7/3 + 2) / 2                     = 13/6  = 2.1666…
  token-weighted  = (7·7/3 + 4·2) / 11 = (73/3) / 11  = 73/33 = 2.2121…
  rate            = (4 + 2) / (9 + 6)                 = 6/15  = 0.4   (= (2.2 − 1) / 3)
  per position    = a ≥ 1: 3 of 5 steps; a ≥ 2: 2 of 5; a ≥ 3: 1 of 5 → [0.6, 0.4, 0.2]  (sum 1.2 = 3 · 0.4)

vLLM, k = 2 — p1: L = [3, 2], d = [2, 2]          → E = 5, N = 2, a = (2, 1),       A = 3, P = 4, mean 2.5;
              p2: L = [2, 2, 1, 1], d = [2, 2, 2, 1] → E = 6, N = 4, a = (1, 1, 0, 0), A = 2, P = 7, mean 1.5.
  pooled          = 11/6                         = 1.8333…
  per-request     = (2.5 + 1.5) / 2              = 2.0
  token-weighted  = (5·2.5 + 6·1.5) / 11 = 21.5/11 = 1.954545…
  rate            = 5/11                         = 0.454545…
  per position    = a ≥ 1: 4 of 6 steps (d ≥ 1: all 6); a ≥ 2: 1 of 5 (d ≥ 2: 5) → [2/3, 0.2]
  per-request totals (extra) agree: steps 6, accepted 5, proposed 11;
  counters' delta disagree: accepted 3 + 1 = 4, so pooled 10/6 and rate 4/11 — recorded as differences.

SGLang, 3 drafts per step — q1: completion 10, verify 3, correct 6, proposed 9 → E = 6 + 3 = 9, mean 3;
                             q2: completion 5,  verify 2, correct 2, proposed 6 → E = 2 + 2 = 4, mean 2.
  (E = correct + verify = completion − 1: the prefill token is in no verify step)
  pooled          = 13/5                  = 2.6
  per-request     = (3 + 2) / 2           = 2.5
  token-weighted  = (9·3 + 4·2) / 13      = 35/13 = 2.6923…
  rate            = 8/15                  = 0.5333…  (= (2.6 − 1) / 3)
  per position    = not recorded by SGLang → None
  SGLang's own spec_accept_length per request = 10/3 and 5/2 (prefill token counted): mean 35/12 = 2.91666…
"""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftscope.core import acceptance, schema
from draftscope.core.summary import summarize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "acceptance"


def _load(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _ledger(backend):
    if backend == "sglang":
        data = _load("sglang")
        return acceptance.from_sglang(data["rows"], data["drafted_per_step"])
    return acceptance.from_records(_load(backend)["records"])


BACKENDS = ("kit_loop", "vllm", "sglang")
EXPECTED = {  # (pooled, per-request, token-weighted, rate, per position), from the docstring's arithmetic
    "kit_loop": (11 / 5, 13 / 6, 73 / 33, 6 / 15, [0.6, 0.4, 0.2]),
    "vllm": (11 / 6, 2.0, 21.5 / 11, 5 / 11, [4 / 6, 1 / 5]),
    "sglang": (13 / 5, 5 / 2, 35 / 13, 8 / 15, None),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_acceptance_length_pooled_over_steps(backend):
    assert _ledger(backend)["mean_pooled"] == pytest.approx(EXPECTED[backend][0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_of_per_request_means(backend):
    assert _ledger(backend)["mean_per_request"] == pytest.approx(EXPECTED[backend][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_weighted_mean(backend):
    assert _ledger(backend)["mean_token_weighted"] == pytest.approx(EXPECTED[backend][2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_acceptance_rate_is_accepted_over_proposed_drafts(backend):
    assert _ledger(backend)["rate"] == pytest.approx(EXPECTED[backend][3])


@pytest.mark.parametrize("backend", BACKENDS)
def test_acceptance_per_draft_position(backend):
    expected = EXPECTED[backend][4]
    got = _ledger(backend)["per_position"]
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_counts_behind_the_figures():
    kit, vllm, sgl = (_ledger(b) for b in BACKENDS)
    assert (kit["requests"], kit["steps"], kit["emitted_tokens"], kit["accepted_drafts"]) == (2, 5, 11, 6)
    assert (vllm["steps"], vllm["accepted_drafts"], vllm["proposed_drafts"]) == (6, 5, 11)
    assert (sgl["steps"], sgl["emitted_tokens"], sgl["accepted_drafts"], sgl["proposed_drafts"]) == (
        5,
        13,
        8,
        15,
    )


def test_vllm_cross_checks_agree_with_the_totals_and_record_the_counters_disagreement():
    checks = {c["source"]: c for c in _ledger("vllm")["cross_checks"]}
    totals = checks["vllm per-request spec-decode metrics (totals)"]
    assert totals["agrees"] is True and totals["differences"] == []
    counters = checks["vllm spec-decode counters (delta per request)"]
    assert counters["agrees"] is False
    diff = {d["field"]: (d["ledger"], d["source"]) for d in counters["differences"]}
    assert diff["accepted_drafts"] == (5, 4)
    assert diff["mean_pooled"] == (pytest.approx(11 / 6), pytest.approx(10 / 6))
    assert diff["rate"] == (pytest.approx(5 / 11), pytest.approx(4 / 11))
    assert "steps" not in diff and "proposed_drafts" not in diff


def test_vllm_records_with_totals_only_give_the_means_and_rate_but_no_positions():
    # p1's totals: 2 steps, 3 accepted, 4 proposed → E = 5, pooled 2.5, rate 0.75
    out = acceptance.from_records(_load("vllm")["totals_only"])
    assert out["mean_pooled"] == pytest.approx(2.5) and out["rate"] == pytest.approx(0.75)
    assert out["per_position"] is None and "totals" in out["source"]


def test_sglang_cross_checks_its_own_accept_length_and_the_token_count():
    checks = {c["source"].split(" (")[0]: c for c in _ledger("sglang")["cross_checks"]}
    assert checks["sglang completion_tokens − 1 − spec_verify_ct"]["agrees"] is True
    own = checks["sglang spec_accept_length"]
    assert own["agrees"] is True and own["mean_per_request"] == pytest.approx(35 / 12)


def test_sglang_disagreeing_counts_are_recorded():
    # completion 6, verify 2 → 6 − 1 − 2 = 3 accepted by the token count, but correct drafts says 2
    out = acceptance.from_sglang(_load("sglang")["disagreeing"], 3)
    check = next(c for c in out["cross_checks"] if c["source"].startswith("sglang completion_tokens"))
    assert check["agrees"] is False
    assert {d["field"]: (d["ledger"], d["source"]) for d in check["differences"]}["accepted_drafts"] == (2, 3)


def test_sglang_without_draft_counts_derives_them_and_skips_rows_without_a_verify_count():
    # q1: 10 − 1 − 3 = 6 accepted, 3·3 = 9 proposed; q2: 2 accepted, 6 proposed; q3 has no verify count
    out = acceptance.from_sglang(_load("sglang")["counts_missing"], 3)
    assert out["requests"] == 2 and out["mean_pooled"] == pytest.approx(13 / 5)
    assert out["rate"] == pytest.approx(8 / 15)
    assert acceptance.from_sglang(_load("sglang")["counts_missing"][2:], 3) is None


@pytest.mark.parametrize("backend", ("kit_loop", "vllm"))
def test_the_summary_carries_the_ledger_and_keeps_the_median_stat(backend):
    records = _load(backend)["records"]
    ids = [r["prompt_id"] for r in records]
    summary = summarize("run", records, ids, partial=True)  # records missing timing fields: a partial run
    assert schema.problems(summary, "summary") == []
    overall = summary["overall"]
    assert overall["acceptance"]["mean_pooled"] == pytest.approx(EXPECTED[backend][0])
    assert overall["acceptance_rate"] == pytest.approx(EXPECTED[backend][3])
    assert set(overall["acceptance_length"]) == {"median", "min", "max", "n"}


def test_a_record_without_its_draft_count_leaves_the_rate_and_positions_unknown_not_wrong():
    # kit fixture with request b's k missing: the means stand (11/5), the proposed drafts cannot be counted
    records = _load("kit_loop")["records"]
    del records[1]["draft_tokens_per_step"]
    out = acceptance.from_records(records)
    assert out["mean_pooled"] == pytest.approx(11 / 5)
    assert out["proposed_drafts"] is None and out["rate"] is None and out["per_position"] is None
    assert schema.problems(summarize("run", records, ["a", "b", "c"], partial=True), "summary") == []


def test_no_acceptance_fields_give_no_ledger():
    assert acceptance.from_records([{"prompt_id": "x"}, {"acceptance_lengths": None}]) is None


steps = st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=12)


@given(st.lists(steps, min_size=1, max_size=6))
def test_properties_of_the_kit_loop_figures(requests):
    k = 4
    out = acceptance.from_records([{"acceptance_lengths": r, "draft_tokens_per_step": k} for r in requests])
    total, count = sum(map(sum, requests)), sum(map(len, requests))
    assert out["mean_pooled"] == pytest.approx(total / count)
    assert out["rate"] == pytest.approx((out["mean_pooled"] - 1) / k)
    assert sum(out["per_position"]) == pytest.approx(k * out["rate"])
    assert out["per_position"] == sorted(out["per_position"], reverse=True)  # acceptance is a prefix
    means = [sum(r) / len(r) for r in requests]
    assert min(means) - 1e-9 <= out["mean_per_request"] <= max(means) + 1e-9
    assert min(means) - 1e-9 <= out["mean_token_weighted"] <= max(means) + 1e-9
