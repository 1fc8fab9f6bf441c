"""`invoke export --format vllm-bench`: the figures behind vLLM's result names, each recomputed here from the
records (the names themselves are checked against vLLM's source in tests/contract/test_vllm_bench_names.py)."""

from __future__ import annotations

import itertools
import json
import statistics

import numpy as np
import pytest
from test_analysis_export import cli
from test_analysis_synthetic import make_run

from draftscope.analysis import timing, vllm_bench
from draftscope.analysis.load import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return make_run(root / "plain", seed=1, repeats=2), make_run(root / "spec", seed=2, draft=True, repeats=1)


def test_tokens_arriving_together_are_one_inter_token_latency():
    # A verification step emits its tokens at once: vLLM's client sees one chunk, so one gap per step.
    assert timing.itls([0.1, 0.1, 0.2, 0.2, 0.2, 0.35]) == pytest.approx([0.1, 0.15])
    assert timing.itls([0.5]) == [] and timing.itls(None) is None and timing.itls([]) is None
    record = {"token_timestamps": [0.1, 0.2, 0.4], "generated_tokens": 3, "request_seconds": 0.5}
    assert timing.tpot(record) == pytest.approx((0.5 - 0.1) / 2)
    assert timing.tpot({**record, "generated_tokens": 1}) is None


def test_the_result_is_the_records_in_vllm_s_units(runs):
    run = load_run(runs[0])
    doc = vllm_bench.result(run)
    seconds = [r["request_seconds"] for r in run.records]
    stamps = [r["token_timestamps"] for r in run.records]
    assert doc["label"] == "plain" and doc["num_prompts"] == doc["completed"] == len(run.records)
    assert doc["failed"] == 0 and doc["errors"] == [""] * len(run.records)
    assert doc["duration"] == pytest.approx(sum(seconds))
    assert doc["latencies"] == seconds
    assert doc["total_output_tokens"] == sum(r["generated_tokens"] for r in run.records)
    assert doc["output_throughput"] == pytest.approx(doc["total_output_tokens"] / sum(seconds))
    assert doc["request_throughput"] == pytest.approx(len(seconds) / sum(seconds))
    assert doc["input_lens"] == [r["prompt_tokens"] for r in run.records]
    assert doc["ttfts"] == [s[0] for s in stamps]  # seconds, as vLLM's per-request lists
    assert doc["mean_ttft_ms"] == pytest.approx(statistics.mean(s[0] for s in stamps) * 1000)  # ms
    assert doc["median_e2el_ms"] == pytest.approx(statistics.median(seconds) * 1000)
    assert doc["std_e2el_ms"] == pytest.approx(statistics.pstdev(seconds) * 1000)  # numpy's std: population
    assert doc["p99_e2el_ms"] == pytest.approx(float(np.percentile(seconds, 99)) * 1000)
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s)]
    assert doc["mean_itl_ms"] == pytest.approx(statistics.mean(gaps) * 1000)
    assert doc["date"] == run.manifest["started_at"][:19].replace("-", "").replace("T", "-").replace(":", "")
    assert doc["request_rate"] == "inf" and doc["max_concurrency"] == 1
    assert not any(k.startswith("spec_decode_") for k in doc)


def test_the_spec_decode_block_is_the_acceptance_ledger_in_vllm_s_definitions(runs):
    run = load_run(runs[1])
    doc = vllm_bench.result(run)
    n = len(run.records)
    # make_run's speculative records: lengths [3, 4, 2, 3], k = 4: accepted drafts per step 2, 3, 1, 2.
    assert doc["spec_decode_num_drafts"] == 4 * n
    assert doc["spec_decode_draft_tokens"] == 16 * n
    assert doc["spec_decode_accepted_tokens"] == 8 * n
    assert doc["spec_decode_acceptance_rate"] == pytest.approx(50.0)  # a percentage, as vLLM prints it
    assert doc["spec_decode_acceptance_length"] == pytest.approx(3.0)  # 1 + accepted / drafts
    # Steps that accepted position i (i = 1..4): 4, 3, 1, 0 of 4 steps, over all steps as vLLM divides.
    assert doc["spec_decode_per_position_acceptance_rates"] == pytest.approx([1.0, 0.75, 0.25, 0.0])


def test_a_run_without_token_timestamps_has_no_ttft_or_itl(runs):
    run = load_run(runs[0])
    run.records = [{**r, "token_timestamps": None} for r in run.records]
    doc = vllm_bench.result(run)
    assert not {"ttfts", "itls", "mean_ttft_ms", "p99_itl_ms", "median_tpot_ms"} & set(doc)
    assert doc["mean_e2el_ms"] > 0


def test_several_runs_are_one_result_per_line_as_append_result_writes(runs, tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, stderr = cli("export", str(runs[0]), "--run", str(runs[1]), "--format", "vllm-bench",
                               "--output", str(out))  # fmt: skip
    assert code == 0, stderr
    assert "2 vLLM benchmark result(s)" in stdout
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["label"] for line in lines] == ["plain", "spec"]
    assert json.loads(lines[1]) == vllm_bench.result(load_run(runs[1]))
