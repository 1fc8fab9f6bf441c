"""Latency percentiles from the records and the leaderboard (`invoke analyze --sort METRIC`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from invoke import Context
from test_analysis_synthetic import make_run  # tests/unit/analysis, on the path (tests/conftest.py)

from draftscope.analysis import leaderboard as L
from draftscope.analysis.load import load_run
from draftscope.cli import analysis as cli_analysis
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lb")
    made = {
        "slow": make_run(folder / "slow", speed=2.0, seed=1),
        "fast": make_run(folder / "fast", speed=0.5, seed=2),
        "mid": make_run(folder / "mid", speed=1.0, seed=3, draft=True),
    }
    return {name: load_run(path) for name, path in made.items()}


def test_ttft_and_itl_are_read_from_the_records_by_hand(runs):
    run = runs["mid"]
    first = [r["token_timestamps"][0] * 1e3 for r in run.records]
    gaps = np.concatenate([np.diff(np.unique(r["token_timestamps"])) * 1e3 for r in run.records])
    assert L.ttft_ms(run) == first and L.itl_ms(run) == pytest.approx(gaps.tolist(), rel=1e-12)
    cells = L.latency_cells(run)
    p50, p90, p99 = (float(x) for x in cells["ttft"].split(" (")[0].split(" / "))
    assert p50 == pytest.approx(np.percentile(first, 50), abs=0.05)
    assert p99 == pytest.approx(np.percentile(first, 99), abs=0.05) and p50 <= p90 <= p99
    assert cells["itl"].endswith(f"(n={gaps.size})")


def test_tokens_arriving_together_are_one_arrival(runs):
    run = runs["mid"]
    record = {**run.records[0], "token_timestamps": [0.010, 0.020, 0.020, 0.020, 0.045, 0.045]}
    one = type(run)(run.path, run.manifest, [record], run.summary)
    assert L.ttft_ms(one) == [10.0] and L.itl_ms(one) == pytest.approx([10.0, 25.0])


def test_leaderboard_ranks_best_first_in_each_direction(runs):
    given_order = [runs["slow"], runs["mid"], runs["fast"]]
    by_speed = [r.run_id for r, _ in L.ranked(given_order, "request-tok-s")]
    assert by_speed == ["fast", "mid", "slow"]
    by_ttft = [r.run_id for r, _ in L.ranked(given_order, "ttft-p50")]
    assert by_ttft == ["fast", "mid", "slow"]  # lower is better: the fast run's first token comes first
    # Only the speculative run has an acceptance figure; the others follow unranked, in the order given.
    rows = L.leaderboard_rows(given_order, "acceptance")
    assert [(r["rank"], r["run"]) for r in rows] == [("1", "mid"), ("—", "slow"), ("—", "fast")]
    assert rows[0]["value"] == "3.00" and rows[1]["value"] == "— (not measured)"


def test_a_run_without_timestamps_has_no_latency_figures(runs, tmp_path):
    run = runs["slow"]
    bare = type(run)(
        run.path, run.manifest, [{**r, "token_timestamps": None} for r in run.records], run.summary
    )
    assert L.latency_cells(bare) == {
        "ttft": "— (no per-token timestamps)",
        "itl": "— (no per-token timestamps)",
    }
    assert [r.run_id for r, _ in L.ranked([bare, runs["fast"]], "itl-p50")] == ["fast", "slow"]


def test_an_unknown_metric_names_the_flag_and_the_choices():
    with pytest.raises(UserError) as err:
        L.metric("speed")
    assert err.value.field == "--sort" and "request-tok-s" in str(err.value.fix)


def test_analyze_sort_prints_the_leaderboard_and_writes_it_into_the_report(runs, tmp_path, capsys):
    report = tmp_path / "rep"
    paths = [str(runs[n].path) for n in ("slow", "mid", "fast")]
    cli_analysis.analyze(Context(), path=paths[0], run=paths[1:], report=str(report), sort="decode-tok-s")
    out = capsys.readouterr().out
    assert "Leaderboard: median decode tok/s (higher is better)" in out
    assert out.index("fast") < out.index("mid") < out.index("slow")
    md = (report / "report.md").read_text(encoding="utf-8")
    assert "Leaderboard by median decode tok/s" in md and "TTFT ms p50 / p90 / p99" in md
    board = md[md.index("Leaderboard by") : md.index("| field |")]
    assert board.index("| 1 | fast |") < board.index("| 2 | mid |") < board.index("| 3 | slow |")
    html = (report / "report.html").read_text(encoding="utf-8")
    assert 'class="leaderboard"' in html and "inter-token latency ms p50 / p90 / p99" in html
    assert json.dumps(read_json(runs["fast"].path / "summary.json"))  # the runs are only read
