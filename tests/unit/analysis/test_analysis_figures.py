"""The report's figures and verdict read at a glance (issue 32): ratio bands on a log axis never below 0, whole-number
ticks on count axes, coinciding series told apart, a figure under "Is it faster?", and the verdict in one plain
sentence — from the comparison documents `compare` writes for synthetic runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_analysis_synthetic import PROMPTS, make_run

from draftscope.analysis import comparison_figures, figures, verdict
from draftscope.analysis.compare import compare_runs, summary_lines, write_comparison
from draftscope.analysis.comparisons import find_comparisons
from draftscope.analysis.load import load_runs
from draftscope.analysis.report import write_report
from draftscope.ops.demo import draft_line


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A base with CPU-like noise (its A/A band runs past ±100%), a speculative run at half the latency, one at the
    same latency, and a quiet base for a resolved comparison; the two drafts have the same acceptance lengths."""
    root = tmp_path_factory.mktemp("figs")
    make_run(root / "runs" / "noisy", seed=1, repeats=2, noise=1.5)
    make_run(root / "runs" / "quiet", seed=2, repeats=4, noise=0.01)
    make_run(root / "runs" / "fast", seed=3, draft=True, repeats=4, speed=0.5, noise=0.01)
    make_run(root / "runs" / "same", seed=4, draft=True, repeats=4, noise=0.01)
    runs = {r.run_id: r for r in load_runs([root / "runs"])}
    for base, cand in (("noisy", "same"), ("quiet", "fast")):
        doc = compare_runs(runs[base], runs[cand], threshold=0.01, resamples=300)
        write_comparison(doc, root / "runs" / "comparisons" / f"{base}__{cand}.json", figure=False)
    return root


def doc(folder, name):
    return json.loads((folder / "runs" / "comparisons" / f"{name}.json").read_text())


def test_ratio_bands_lie_above_zero_on_a_log_axis(folder):
    noisy = doc(folder, "noisy__same")
    assert noisy["noise_band"]["half_width"] > 1  # the case that drew `1 − w` below 0 on a linear axis
    for d in (noisy, doc(folder, "quiet__fast")):
        fig = comparison_figures.draw_comparison(d)
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and ax.get_ylim()[0] > 0
        spans = [p for p in ax.patches]
        assert spans and all(p.get_y() > 0 for p in spans), [p.get_y() for p in spans]
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert len(ticks) >= 2  # labelled in plain numbers, even over a narrow range
    low, high = comparison_figures.noise_interval(noisy["noise_band"])
    assert 0 < low < 1 < high
    assert (
        comparison_figures.admission_limit(noisy) <= 0
    )  # nothing can be admitted there, and the figure says so
    texts = " ".join(t.get_text() for t in comparison_figures.draw_comparison(noisy).axes[0].texts)
    assert "no speedup can be admitted" in texts


def test_the_speedup_figure_puts_each_comparison_on_a_positive_log_axis(folder):
    docs = [doc(folder, "noisy__same"), doc(folder, "quiet__fast")]
    ax = comparison_figures.draw_speedup(docs).axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] > 0
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["fast\nvs quiet", "same\nvs noisy"]  # the first comparison on top
    verdicts = " ".join(t.get_text() for t in ax.texts)
    assert "admitted" in verdicts and "not admitted" in verdicts


def test_count_axes_have_whole_number_ticks(folder):
    runs = load_runs([folder / "runs" / "fast", folder / "runs" / "same"])
    hist = figures.draw_acceptance(runs).axes[0]
    assert all(float(t).is_integer() for t in hist.get_xticks()), hist.get_xticks()
    ids = [p["id"] for p in json.loads(PROMPTS.read_text())["prompts"]]
    few = make_run(folder / "few", seed=9, repeats=1, skip=tuple(ids[3:]))
    (run,) = load_runs([few])
    assert 1 < len(run.records) < 6  # where the default locator put ticks at 0.5, 1.5, …
    timeline = figures.draw_timeline(run).axes[0]
    assert all(float(t).is_integer() for t in timeline.get_xticks()), timeline.get_xticks()


def test_identical_acceptance_series_stay_distinguishable(folder):
    runs = load_runs([folder / "runs" / "fast", folder / "runs" / "same"])
    ax = figures.draw_acceptance(runs).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "identical to fast" in labels[1] and "identical" not in labels[0]
    containers = ax.containers
    assert len(containers) == 2
    xs = [sorted(round(b.get_x(), 6) for b in c.patches) for c in containers]
    assert set(xs[0]).isdisjoint(xs[1])  # side by side, not on top of each other
    assert containers[0].patches[0].get_hatch() != containers[1].patches[0].get_hatch()
    heights = [np.array([b.get_height() for b in c.patches]) for c in containers]
    assert np.allclose(heights[0], heights[1])


def test_the_verdict_is_one_plain_sentence(folder):
    noisy, quiet = doc(folder, "noisy__same"), doc(folder, "quiet__fast")
    said = verdict.sentence(noisy)
    assert not verdict.resolved(noisy)
    assert said.startswith("Request latency over 12 prompts: speedup ")
    assert "cannot be resolved on this machine" in said and "A/A noise" in said
    assert "what holds is exactness: greedy tokens identical to the base in 48 of 48 generations" in said
    assert said.count(". ") == 0 and said.endswith(".")  # one sentence
    said = verdict.sentence(quiet)
    assert verdict.resolved(quiet) and "is resolved on this machine" in said and "candidate faster" in said
    assert "admitted at 1.00%" in said
    lines = summary_lines(noisy)
    assert lines[1] == f"  in short: {verdict.sentence(noisy)}"
    assert any(
        "request tok/s, unpaired medians over all records (not the verdict's measure)" in x for x in lines
    )


def test_the_report_answers_is_it_faster_with_a_figure_and_the_sentence(folder, tmp_path):
    runs = load_runs([folder / "runs" / n for n in ("noisy", "quiet", "fast", "same")])
    shown, _ = find_comparisons(runs)
    assert len(shown) == 2
    files = {f.name for f in write_report(runs, tmp_path / "rep", shown)}
    assert {"speedup.png", "comparison-noisy__same.png", "comparison-quiet__fast.png"} <= files
    html = (tmp_path / "rep" / "report.html").read_text()
    section = html[html.index("<h2>Is it faster?</h2>") : html.index("<h2>Runs</h2>")]
    assert section.count("data:image/png;base64,") == 1 and 'alt="Is it faster?' in section
    for c in shown:
        assert c.cells()["sentence"] in section
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md[md.index("## Is it faster?") : md.index("## Runs")]
    assert "(speedup.png)" in section and all(c.cells()["sentence"] in section for c in shown)


def test_the_demo_explains_the_acceptance_length_where_it_prints_it():
    book = {"mean_pooled": 2.5, "steps": 40, "rate": 0.375, "per_position": [0.6, 0.5, 0.3, 0.1]}
    line, enough = draft_line(book)
    assert enough and "mean acceptance length 2.500 tokens per verification step" in line
    assert "L = accepted drafts + 1" in line and "the demo checks it is at least 2: met" in line
    assert "≥" not in line
    line, enough = draft_line({**book, "mean_pooled": 1.2})
    assert not enough and "NOT MET" in line
