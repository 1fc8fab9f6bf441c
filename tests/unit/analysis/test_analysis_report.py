"""Loading runs (partial ones included), the report folder, and the analysis tasks as a user runs them."""

import json
import os
import subprocess
import sys

import pytest
from invoke import Collection
from PIL import Image
from test_analysis_synthetic import make_run

from draftscope.analysis.load import load_run, load_runs
from draftscope.analysis.report import run_row, write_report
from draftscope.cli.analysis import ANALYSIS_TASKS, ns_evidence
from draftscope.core import schema
from draftscope.core.errors import UserError

from support import HEAVY, ROOT, run_invoke, run_tasks

LAUNCHER = (
    "import sys\n"
    "from invoke import Collection, Program\n"
    "from draftscope.cli.analysis import ANALYSIS_TASKS, ns_evidence\n"
    "ns = Collection(*ANALYSIS_TASKS)\n"
    "ns.add_collection(ns_evidence)\n"
    "Program(namespace=ns, name='draftscope', binary='invoke').run(['invoke', *sys.argv[1:]])\n"
)


def run_cli(*args, cwd=ROOT, env=None, timeout=120):
    """`invoke ARGS` in a fresh interpreter, as a user runs it: through the main namespace once the analysis
    tasks are wired into it, until then the same tasks under the same parser."""
    from draftscope.cli import ns

    if "analyze" in ns.task_names:
        return run_invoke(*args, cwd=cwd, env=env, timeout=timeout)
    return subprocess.run(
        [sys.executable, "-c", LAUNCHER, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli(*args, cwd=None):
    """The same tasks and parser in this process (no interpreter start-up): (exit code, stdout, stderr)."""
    ns = Collection(*ANALYSIS_TASKS)
    ns.add_collection(ns_evidence)
    return run_tasks(ns, *args, cwd=cwd)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_run(root / "A", seed=1)
    make_run(root / "B", seed=2)
    make_run(root / "S", seed=3, draft=True, repeats=1)
    make_run(root / "P", seed=4, status="timed_out")
    return root


def assert_png(path):
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100


def test_a_partial_run_is_loaded_and_labelled_partial(folder):
    run = load_run(folder / "P")
    assert run.partial and run.status_label.startswith("partial (timed_out")
    assert run_row(run)["prompts"].endswith("(11/12 done)")
    assert not load_run(folder / "A").partial


def test_a_torn_last_record_is_skipped_with_a_note(tmp_path, folder):
    import shutil

    shutil.copytree(folder / "P", tmp_path / "P")
    with (tmp_path / "P" / "records.jsonl").open("a") as fh:
        fh.write('{"schema_version": 1, "prompt_id": "x"')
    # Written after the summary, the torn line is an edit its records_sha256 names (core/integrity.py) ...
    with pytest.raises(UserError, match=r"\$\.records_sha256: records\.jsonl has SHA-256"):
        load_run(tmp_path / "P")
    # ... before any summary (a writer killed mid-line), it is skipped with a note.
    (tmp_path / "P" / "summary.json").unlink()
    run = load_run(tmp_path / "P")
    assert len(run.records) == 22 and any("torn" in n for n in run.notes)


def test_a_folder_of_runs_stands_for_each(folder):
    assert [r.run_id for r in load_runs([folder])] == ["A", "B", "P", "S"]
    with pytest.raises(UserError, match="not a run directory"):
        load_runs([folder / "nope"])


def test_the_report_folder_has_markdown_html_and_valid_figures(tmp_path, folder):
    runs = load_runs([folder / n for n in ("A", "B", "S", "P")])
    files = write_report(runs, tmp_path / "rep")
    names = {f.name for f in files}
    assert {
        "report.md",
        "report.html",
        "throughput-by-prompt.png",
        "token-latency-cdf.png",
        "acceptance-length.png",
        "timeline-A.png",
        "timeline-P.png",
    } <= names
    pngs = sorted((tmp_path / "rep").glob("*.png"))
    assert len(pngs) >= 3
    for png in pngs:
        assert_png(png)
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| status | completed | completed | completed | partial (timed_out" in md
    assert "Partial runs:** P" in md and "![Acceptance length" in md


def test_no_acceptance_histogram_without_a_speculative_run(tmp_path, folder):
    files = write_report(load_runs([folder / "A", folder / "B"]), tmp_path / "rep")
    assert len([f for f in files if f.suffix == ".png"]) == 4  # throughput, CDF, two timelines
    assert not (tmp_path / "rep" / "acceptance-length.png").exists()


def test_an_existing_report_folder_is_refused_and_unchanged(tmp_path, folder):
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        write_report(load_runs([folder / "A"]), tmp_path / "rep")
    assert [p.name for p in (tmp_path / "rep").iterdir()] == ["keep.txt"]


def test_analyze_prints_the_table_and_writes_the_report(tmp_path, folder):
    rep = tmp_path / "rep"
    result = run_cli(
        "analyze",
        str(folder / "A"),
        "--run",
        str(folder / "S"),
        "--run",
        str(folder / "P"),
        "--report",
        str(rep),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for needle in (
        "request tok/s",
        "decode tok/s",
        "acceptance length",
        "greedy agreement",
        "tiny (kit-built)",
        "local runtime",
        "partial (timed_out",
        "sha256 dde763618263",
        "CPU x86_64",
    ):
        assert needle in out, needle
    assert "report.html" in out and (rep / "report.html").is_file()
    again = cli("analyze", str(folder / "A"), "--report", str(rep))
    assert again.returncode == 2
    (line,) = again.stderr.strip().splitlines()
    assert line.startswith("error:") and "already exists" in line and "--report" in line


def test_compare_task_writes_a_valid_comparison_and_prints_the_verdict(tmp_path, folder):
    result = cli("compare", str(folder / "A"), str(folder / "B"), "--resamples", "500", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path = tmp_path / "comparisons" / "A__B.json"
    doc = json.loads(path.read_text())
    assert schema.problems(doc, "comparison") == []
    assert result.stdout.startswith("NOT ADMITTED: B vs A at a 1.00% threshold")
    assert doc["resamples"] == 500 and doc["seed"] == 0 and doc["threshold"] == 0.01
    again = cli("compare", str(folder / "A"), str(folder / "B"), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_compare_task_refuses_a_partial_prompt_set_unless_allowed(tmp_path, folder):
    unfinished = cli("compare", str(folder / "A"), str(folder / "P"), "--output", str(tmp_path / "c.json"))
    assert unfinished.returncode == 2
    (line,) = unfinished.stderr.strip().splitlines()
    assert "run P is unfinished (status 'timed_out'" in line and "--allow-unfinished" in line
    result = cli(
        "compare",
        str(folder / "A"),
        str(folder / "P"),
        "--allow-unfinished",
        "--output",
        str(tmp_path / "c.json"),
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "chat-multiturn" in line or "missing in the candidate" in line
    ok = cli(
        "compare",
        str(folder / "A"),
        str(folder / "P"),
        "--allow-unfinished",
        "--allow-subset",
        "--resamples",
        "200",
        "--output",
        str(tmp_path / "c.json"),
    )
    assert ok.returncode == 0, ok.stderr
    assert "P is partial" in ok.stdout


def test_compare_bounds_its_resamples(tmp_path, folder):
    result = cli("compare", str(folder / "A"), str(folder / "B"), "--resamples", "1000001", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--resamples: must be at most 1,000,000" in line and "fix:" in line
    assert not (tmp_path / "comparisons").exists()


def test_analysis_tasks_never_import_torch(tmp_path, folder):
    fake = tmp_path / "fake"
    for name in HEAVY:
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(
            f"open({str(tmp_path / ('imported-' + name))!r}, 'w').close()\n"
        )
    env = {"PYTHONPATH": str(fake)}
    assert run_cli("analyze", str(folder / "S"), "--report", str(tmp_path / "r"), env=env).returncode == 0
    assert (
        run_cli(
            "compare",
            str(folder / "A"),
            str(folder / "S"),
            "--resamples",
            "100",
            "--output",
            str(tmp_path / "c.json"),
            env=env,
        ).returncode
        == 0
    )
    assert sorted(p.name for p in tmp_path.glob("imported-*")) == []
