"""`analyze` shows the comparisons `compare` wrote (issue 20): found beside the runs or named, matched on run id and
manifest hash, leading the report; the demo runs compare before analyze and names one speed measure."""

from __future__ import annotations

import json
import os

import pytest
from test_analysis_synthetic import make_run

from draftscope.analysis.compare import compare_runs, write_comparison
from draftscope.analysis.comparisons import find_comparisons
from draftscope.analysis.load import load_runs
from draftscope.analysis.report import write_report
from draftscope.core.errors import UserError
from draftscope.ops.demo import speed_line, steps_for_display


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    make_run(root / "runs" / "A", seed=1, repeats=2)
    make_run(root / "runs" / "S", seed=3, draft=True, repeats=2, speed=0.5)
    base, cand = load_runs([root / "runs" / "A", root / "runs" / "S"])
    doc = compare_runs(base, cand, threshold=0.01, resamples=200)
    write_comparison(doc, root / "runs" / "comparisons" / "S.json", figure=False)
    (root / "runs" / "comparisons" / "other.json").write_text('{"kind": "something else"}')
    return root


def test_comparisons_beside_the_runs_are_found_and_lead_the_report(folder, tmp_path):
    runs = load_runs([folder / "runs" / "A", folder / "runs" / "S"])
    shown, notes = find_comparisons(runs)
    assert [s.path.name for s in shown] == ["S.json"] and notes == []
    doc = shown[0].doc
    # speedup = 1 / median latency ratio; the interval inverts: [1 / high, 1 / low]
    assert shown[0].speedup == pytest.approx(1 / doc["median_ratio"])
    assert shown[0].interval == pytest.approx((1 / doc["ci"]["high"], 1 / doc["ci"]["low"]))
    cells = shown[0].cells()
    assert cells["verdict"] == doc["verdict"]["decision"].replace("_", " ")
    assert cells["noise_band"] == f"±{doc['noise_band']['half_width']:.2%}"
    write_report(runs, tmp_path / "rep", shown)
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.index("Is it faster?") < html.index("<h2>Runs</h2>")
    assert cells["speedup"] in html and cells["interval"] in html
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.index("## Is it faster?") < md.index("## Runs") and cells["speedup"] in md


def test_a_comparison_of_runs_not_analysed_is_not_shown(folder):
    runs = load_runs([folder / "runs" / "A"])
    assert find_comparisons(runs)[0] == []
    shown, notes = find_comparisons(runs, [folder / "runs" / "comparisons" / "S.json"])
    assert shown == [] and "not analysed here" in notes[0]


def test_a_named_file_that_is_not_a_comparison_is_an_error_naming_the_option(folder):
    runs = load_runs([folder / "runs" / "A"])
    with pytest.raises(UserError, match="--comparison"):
        find_comparisons(runs, [folder / "runs" / "comparisons" / "other.json"])
    with pytest.raises(UserError, match="--comparison"):
        find_comparisons(runs, [folder / "missing.json"])


def test_a_comparison_of_an_earlier_run_with_the_same_id_is_not_mistaken(folder, tmp_path):
    doc = json.loads((folder / "runs" / "comparisons" / "S.json").read_text())
    doc["base"]["manifest_sha256"] = "0" * 64
    (tmp_path / "comparisons").mkdir()
    (tmp_path / "comparisons" / "old.json").write_text(json.dumps(doc))
    runs = load_runs([folder / "runs" / "A", folder / "runs" / "S"])
    shown, _ = find_comparisons(runs, [tmp_path / "comparisons"])
    assert [s.path.name for s in shown] == ["S.json"]


def test_the_report_shows_the_acceptance_ledger_before_the_median(folder, tmp_path):
    runs = load_runs([folder / "runs" / "S"])
    ledger = runs[0].summary["overall"]["acceptance"]
    write_report(runs, tmp_path / "rep")
    html = (tmp_path / "rep" / "report.html").read_text()
    assert (
        f"{ledger['mean_pooled']:.2f} ({ledger['emitted_tokens']} tokens / {ledger['steps']} steps)" in html
    )
    assert html.index("acceptance length (mean over steps)") < html.index("acceptance length (median")
    assert "acceptance rate" in html and "acceptance per draft position" in html


def test_the_demo_compares_before_it_analyzes_and_hands_the_comparisons_to_analyze(tmp_path):
    steps = steps_for_display(tmp_path / "demo", os.devnull)
    keys = [s.key for s in steps]
    assert keys.index("compare-speculative") < keys.index("analyze")
    assert keys.index("compare-prefix") < keys.index("analyze")
    analyze = steps[keys.index("analyze")].argv
    assert analyze[analyze.index("--comparison") + 1] == str(tmp_path / "demo" / "comparisons")


def test_the_demo_summary_names_one_speed_measure_the_comparison_speedup(folder):
    doc = json.loads((folder / "runs" / "comparisons" / "S.json").read_text())
    line = speed_line("spec", folder / "runs" / "S", folder / "runs" / "comparisons" / "S.json")
    assert "request latency" in line and "tok/s" not in line
    assert f"speedup {1 / doc['median_ratio']:.3f}×" in line
    assert f"[{1 / doc['ci']['high']:.3f}×, {1 / doc['ci']['low']:.3f}×]" in line
    assert doc["verdict"]["decision"].replace("_", " ") in line
