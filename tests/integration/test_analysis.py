"""Analysis on real tiny CPU runs (issue 5, acceptance 1–3): analyze, an A/A compare, and a reproduction.

Three runs are made once for the module, started together so that the A/A pair sees the same machine load.
Skipped until the kit-built tiny model files are in place (`invoke tiny.build --check`).
"""

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from draftscope.core import schema

from browser import compressed_ratio, dump_dom, need_browser, png_facts, screenshot
from support import ROOT, needs_tiny_files, run_invoke, tiny_benchmark

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    needs_tiny_files(),
]

TINY = tiny_benchmark("local", "--max-new-tokens", "16")
LAUNCHER = (
    "import sys\n"
    "from invoke import Collection, Program\n"
    "from draftscope.cli.analysis import ANALYSIS_TASKS, ns_evidence\n"
    "ns = Collection(*ANALYSIS_TASKS)\n"
    "ns.add_collection(ns_evidence)\n"
    "Program(namespace=ns, name='draftscope', binary='invoke').run(['invoke', *sys.argv[1:]])\n"
)


def run_cli(*args, cwd=ROOT, timeout=300):
    """`invoke ARGS` once the analysis tasks are in the main namespace; until then the same tasks, same parser."""
    from draftscope.cli import ns

    if "analyze" in ns.task_names:
        return run_invoke(*args, cwd=cwd, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-c", LAUNCHER, *args],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run_together(folder, argv):
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "invoke", *args, "--output", str(folder / name)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in argv.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: {out[-1500:]}{err[-1500:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The A/A pair A, B started together (both see the same load), then the speculative run S. With S started
    beside them, A and B came out tens of percent apart (S ends first and, it seems, leaves the machine to
    whichever of the two lags), and in one CI run the A/A comparison admitted B against A."""
    folder = tmp_path_factory.mktemp("analysis")
    _run_together(folder, {"A": [*TINY, "--repeats", "2"], "B": [*TINY, "--repeats", "2"]})
    _run_together(folder, {"S": [*TINY, "--repeats", "1", "--draft", "tiny"]})
    return {name: folder / name for name in ("A", "B", "S")}


def test_analyze_writes_the_report_with_valid_figures_and_prints_the_table(runs, tmp_path):
    rep = tmp_path / "REP"
    result = run_cli(
        "analyze", str(runs["A"]), "--run", str(runs["B"]), "--run", str(runs["S"]), "--report", str(rep)
    )
    assert result.returncode == 0, result.stderr
    for needle in (
        "request tok/s",
        "decode tok/s",
        "acceptance length",
        "greedy agreement",
        "tiny (kit-built)",
        "completed",
        "local runtime",
    ):
        assert needle in result.stdout, needle
    assert (rep / "report.md").is_file() and (rep / "report.html").is_file()
    pngs = sorted(rep.glob("*.png"))
    assert len(pngs) >= 3 and (rep / "acceptance-length.png") in pngs
    for png in pngs:
        with Image.open(png) as img:
            img.verify()
    assert (rep / "report.html").read_text().count("data:image/png;base64,") == len(pngs)


def test_an_a_a_comparison_is_not_admitted_at_1_percent(runs, tmp_path):
    out = tmp_path / "aa.json"
    result = run_cli("compare", str(runs["A"]), str(runs["B"]), "--threshold", "1%", "--output", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert schema.problems(doc, "comparison") == []
    assert doc["median_ratio"] > 0 and doc["ci"]["low"] <= doc["median_ratio"] <= doc["ci"]["high"]
    assert doc["verdict"]["decision"] == "not_admitted", doc["verdict"]["reason"]
    assert doc["tokens"]["expected_identical"] and doc["tokens"]["first_mismatch"] is None
    assert doc["noise_band"] is not None and (tmp_path / "aa.png").is_file()
    assert result.stdout.startswith("NOT ADMITTED")


def test_plain_and_speculative_greedy_tokens_agree(runs, tmp_path):
    out = tmp_path / "spec.json"
    result = run_cli("compare", str(runs["A"]), str(runs["S"]), "--output", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    tokens = json.loads(out.read_text())["tokens"]
    assert tokens["expected_identical"] and tokens["compared"] == 12 and tokens["identical"] == 12


def test_reproduce_gives_identical_token_ids_and_a_valid_comparison(runs, tmp_path):
    new, comp = tmp_path / "A-again", tmp_path / "repro.json"
    # From another directory: the frozen config and the copied prompts are all a reproduction needs.
    result = run_cli(
        "--search-root",
        str(ROOT),
        "reproduce",
        str(runs["A"]),
        "--output",
        str(new),
        "--comparison",
        str(comp),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "image checks skipped" in result.stdout and "token ids identical" in result.stdout
    doc = json.loads(comp.read_text())
    assert schema.problems(doc, "comparison") == []
    assert doc["kind"] == "reproduction" and doc["reproduction"]["tokens_identical"] is True
    assert doc["tokens"]["compared"] == 24 and doc["tokens"]["identical"] == 24
    manifest = json.loads((new / "manifest.json").read_text())
    original = json.loads((runs["A"] / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["inputs"][0]["sha256"] == original["inputs"][0]["sha256"]
    frozen = {k: v for k, v in original["config"].items() if k != "prompts"}
    assert {k: v for k, v in manifest["config"].items() if k != "prompts"} == frozen


def test_the_report_leads_with_the_speedup_and_the_mean_acceptance_and_renders_in_a_browser(runs, tmp_path):
    """Issue 20, acceptance 1: compare first (into comparisons/ beside the runs, where analyze finds it), then the
    report: speedup, interval, verdict and noise band at the top; the pooled mean acceptance length (not the
    median), the rate and the per-position rates; checked in the DOM a headless browser rendered, and on its
    screenshot."""
    browser = need_browser()
    comparison = runs["A"].parent / "comparisons" / "speculative.json"
    result = run_cli("compare", str(runs["A"]), str(runs["S"]), "--output", str(comparison))
    assert result.returncode == 0, result.stdout + result.stderr
    rep = tmp_path / "REP"
    result = run_cli("analyze", str(runs["A"]), "--run", str(runs["S"]), "--report", str(rep))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Comparisons" in result.stdout and "1 comparison(s) at the top" in result.stdout

    doc = json.loads(comparison.read_text())
    summary = json.loads((runs["S"] / "summary.json").read_text())["overall"]
    ledger = summary["acceptance"]
    assert (
        ledger["mean_pooled"] != summary["acceptance_length"]["median"]
    )  # the figure the report used to show
    speedup = f"{1 / doc['median_ratio']:.3f}×"
    interval = f"[{1 / doc['ci']['high']:.3f}×, {1 / doc['ci']['low']:.3f}×]"
    expected = [
        "Is it faster?",
        speedup,
        interval,
        doc["verdict"]["decision"].replace("_", " "),
        f"±{doc['noise_band']['half_width']:.2%}",
        f"{ledger['mean_pooled']:.2f} ({ledger['emitted_tokens']} tokens / {ledger['steps']} steps)",
        f"{ledger['rate']:.3f} ({ledger['accepted_drafts']} / {ledger['proposed_drafts']})",
        " ".join(f"{i}: {p:.2f}" for i, p in enumerate(ledger["per_position"], 1)),
    ]
    dom = dump_dom(browser, rep / "report.html")
    print(
        f"report shows: speedup {speedup} {interval}, mean acceptance {ledger['mean_pooled']:.2f}, "
        f"rate {ledger['rate']:.3f}, per position {ledger['per_position']}"
    )
    for needle in expected:
        assert needle in dom, needle
    assert dom.index("Is it faster?") < dom.index("<h2>Runs</h2>")
    assert dom.index("acceptance length (mean over steps)") < dom.index("acceptance length (median")
    assert (rep / "report.md").read_text().count(speedup) == 1

    shot = screenshot(browser, rep / "report.html", tmp_path / "report.png")
    width, height, colours = png_facts(shot)
    ratio = compressed_ratio(shot)
    print(f"screenshot {width}×{height}, {colours} colours, compresses {ratio:.1f}×")
    assert (width, height) == (1280, 2400)
    assert (
        colours > 64 and ratio < 100
    )  # text, tables and figures; a blank page has one colour and packs >1000×
