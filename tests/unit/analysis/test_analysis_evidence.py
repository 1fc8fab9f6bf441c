"""research/: the committed evidence verifies, one changed byte anywhere fails naming the file, `add` never
overwrites, and claims.yaml carries every historical figure with its provenance (issue 5, acceptance 4 and 5)."""

import importlib.util
import inspect
import json
import shutil

import pytest
import yaml
from test_analysis_report import cli
from test_analysis_synthetic import make_run

from draftscope.analysis import evidence
from draftscope.analysis.compare import compare_runs, write_comparison
from draftscope.analysis.load import load_run
from draftscope.core import rundir, schema
from draftscope.core.errors import UserError

from support import ROOT

# Slow: most tests verify a copy of research/, every committed record against its schema (seconds each).
pytestmark = pytest.mark.slow

RESEARCH = ROOT / "research"
CPU_REPORT = "evidence/prefix-head-cpu/measurements/prefix-head-cpu.json"


def failures(root):
    return [f for f in evidence.verify(root) if not f.ok]


@pytest.fixture(autouse=True)
def clean_kit(monkeypatch):
    """Runs made here say a clean commit, as `evidence.add` demands (test_evidence_git.py checks the rule)."""
    kit = {"version": "0.1.0", "git_commit": "0" * 40, "git_dirty": False}
    monkeypatch.setattr(rundir, "kit_info", lambda: dict(kit))


@pytest.fixture
def research(tmp_path):
    shutil.copytree(RESEARCH, tmp_path / "research")
    return tmp_path / "research"


def test_the_committed_research_folder_verifies():
    findings = evidence.verify(RESEARCH)
    assert [f.line() for f in findings if not f.ok] == []
    assert findings[0].file == "SHA256SUMS"
    checked = {f.file for f in findings}
    assert "claims.yaml" in checked and "studies/tiny-cpu-aa.yaml" in checked
    assert {"studies/prefix-head-cpu.yaml", "studies/prefix-head-gpu.yaml", CPU_REPORT} <= checked
    (measured,) = [f for f in findings if f.file == CPU_REPORT and not f.tag]  # not its `superseded` line
    assert measured.line() == f"ok   {CPU_REPORT} (head-bench)"


def test_evidence_verify_task_passes_on_the_committed_folder():
    result = cli("evidence.verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "evidence verified" in result.stdout


def test_one_flipped_byte_in_any_file_fails_naming_it(research):
    files = evidence.summed_files(research)
    assert files
    for rel in files:
        path = research / rel
        original = path.read_bytes()
        flipped = bytearray(original or b"\x00")  # an empty file (a quiet log) gains a byte instead
        if original:
            flipped[len(flipped) // 2] ^= 0x01
        path.write_bytes(bytes(flipped))
        # The hash pass of `verify` (its schema pass is exercised below); one finding, naming the file.
        (found,) = evidence.check_hashes(research)
        assert (found.ok, found.file) == (False, rel) and "SHA-256 differs" in found.detail
        path.write_bytes(original)
    assert failures(research) == []


@pytest.mark.parametrize(
    "rel",
    [
        "claims.yaml",
        "evidence/tiny-cpu-aa/runs/tiny-cpu-aa-1/records.jsonl",
        "evidence/tiny-cpu-aa/comparisons/tiny-cpu-aa.png",
    ],
)
def test_the_verify_task_fails_naming_the_changed_file(research, rel):
    path = research / rel
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x20
    path.write_bytes(bytes(data))
    result = cli("evidence.verify", "--root", str(research))
    assert result.returncode == 1
    assert f"FAIL {rel}: SHA-256 differs" in result.stdout
    assert rel in result.stderr.strip().splitlines()[-1]


def test_unlisted_and_missing_files_fail(research):
    (research / "studies" / "extra.yaml").write_text("x: 1\n")
    assert any(f.file == "studies/extra.yaml" and "not listed" in f.detail for f in failures(research))
    (research / "studies" / "extra.yaml").unlink()
    (research / "studies" / "tiny-cpu-aa.yaml").unlink()
    assert any("listed in SHA256SUMS but missing" in f.detail for f in failures(research))


def test_add_copies_a_run_and_a_comparison_and_never_overwrites(tmp_path, research):
    a = make_run(tmp_path / "runs" / "aa-1", seed=1)
    b = make_run(tmp_path / "runs" / "aa-2", seed=2)
    added = evidence.add(research, a, "tiny-cpu-aa")
    assert "evidence/tiny-cpu-aa/runs/aa-1/manifest.json" in added
    doc = compare_runs(load_run(a), load_run(b), threshold=0.01, resamples=200)
    comp = write_comparison(doc, tmp_path / "aa.json")
    added = evidence.add(research, comp, "tiny-cpu-aa")
    assert added == ["evidence/tiny-cpu-aa/comparisons/aa.json", "evidence/tiny-cpu-aa/comparisons/aa.png"]
    assert failures(research) == []
    with pytest.raises(UserError, match="never overwritten"):
        evidence.add(research, a, "tiny-cpu-aa")
    with pytest.raises(UserError, match="no study 'nope'"):
        evidence.add(research, b, "nope")
    # A schema failure inside the evidence is found even when the hashes are updated to match.
    records = research / "evidence/tiny-cpu-aa/runs/aa-1/records.jsonl"
    records.write_text(records.read_text().replace('"repeat": 0', '"repeat": -1', 1))
    sums = evidence.read_sums(research)
    sums["evidence/tiny-cpu-aa/runs/aa-1/records.jsonl"] = evidence.sha256_file(records)
    evidence.write_sums(research, sums)
    (bad,) = failures(research)
    assert bad.file == "evidence/tiny-cpu-aa/runs/aa-1/records.jsonl" and "line 1" in bad.detail
    with pytest.raises(UserError, match="does not verify"):
        evidence.add(research, b, "tiny-cpu-aa")


@pytest.mark.parametrize("plant", ["file-link", "folder-link", "pipe"])
def test_add_copies_nothing_from_outside_the_run(tmp_path, research, plant):
    """A run is copied with links followed: a link out of it (or a pipe, which would hang the copy) is refused."""
    import os

    run = make_run(tmp_path / "runs" / "aa-1", seed=1)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("not for the research folder")
    if plant == "file-link":
        (run / "logs" / "key").symlink_to(secret / "key")
    elif plant == "folder-link":
        (run / "logs" / "more").symlink_to(secret, target_is_directory=True)
    else:
        os.mkfifo(run / "logs" / "pipe")
    before = sorted(p.relative_to(research) for p in research.rglob("*"))
    with pytest.raises(UserError, match="logs/"):
        evidence.add(research, run, "tiny-cpu-aa")
    assert sorted(p.relative_to(research) for p in research.rglob("*")) == before


def test_a_comparison_figure_outside_its_folder_is_refused(tmp_path, research):
    a = make_run(tmp_path / "runs" / "aa-1", seed=1)
    b = make_run(tmp_path / "runs" / "aa-2", seed=2)
    doc = compare_runs(load_run(a), load_run(b), threshold=0.01, resamples=200)
    comp = write_comparison(doc, tmp_path / "aa.json")
    planted = json.loads(comp.read_text())
    planted["figure"] = "../../secret.png"
    comp.write_text(json.dumps(planted))
    with pytest.raises(UserError, match=r"\$\.figure: must name a file beside the comparison"):
        evidence.add(research, comp, "tiny-cpu-aa")


def test_add_task(tmp_path, research):
    run = make_run(tmp_path / "r1", seed=3)
    result = cli("evidence.add", str(run), "--study", "tiny-cpu-aa", "--root", str(research))
    assert result.returncode == 0, result.stderr
    assert cli("evidence.verify", "--root", str(research)).returncode == 0
    again = cli("evidence.add", str(run), "--study", "tiny-cpu-aa", "--root", str(research))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1


def test_add_task_rewrites_the_host_paths_of_a_run_before_summing_it(tmp_path, research, capsys):
    """What ran stays recorded; where on this machine does not: the steps' interpreter and run directory and a log's
    site-packages path become `…/NAME` and `<run>` in the copy, whose hashes are then the ones summed."""
    run = make_run(tmp_path / "r1", seed=3)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["steps"] = [
        {
            "name": "benchmark",
            "status": "completed",
            "argv": [
                "/opt/someone/venv/bin/python",
                "-m",
                "draftscope",
                "worker",
                "benchmark",
                "--run-dir",
                str(run),
            ],
        }
    ]
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "logs").mkdir(exist_ok=True)
    (run / "logs" / "benchmark.log").write_text(
        "warning from /opt/someone/venv/lib/site-packages/x/y.py:3\r\n"
    )
    result = cli("evidence.add", str(run), "--study", "tiny-cpu-aa", "--root", str(research))
    assert result.returncode == 0, result.stderr
    assert "host paths rewritten" in result.stdout
    copy = research / "evidence" / "tiny-cpu-aa" / "runs" / manifest["run_id"]
    text = (copy / "manifest.json").read_text() + (copy / "logs" / "benchmark.log").read_text()
    assert "/opt/someone" not in text and str(tmp_path) not in text
    assert '"<run>"' in text and "…/python" in text and "…/y.py:3" in text
    assert (copy / "logs" / "benchmark.log").read_bytes().endswith(b"\r\n")
    assert cli("evidence.verify", "--root", str(research)).returncode == 0
    assert _scrub_tool().main(["--check", str(copy)]) == 0


# --- measurements: head-bench reports (and head-study study.json) in a measurement study -----------------------


@pytest.fixture
def report(tmp_path):
    """A copy of the committed CPU head-bench report under a new name: valid, made with prefix-head-cpu's options."""
    path = tmp_path / "again.json"
    doc = json.loads((RESEARCH / CPU_REPORT).read_text())
    doc["kit"].update(git_commit="0" * 40, git_dirty=False)  # the committed one was made from a dirty tree
    path.write_text(json.dumps(doc))
    return path


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def _resum(research, rel):
    sums = evidence.read_sums(research)
    sums[rel] = evidence.sha256_file(research / rel)
    evidence.write_sums(research, sums)


def test_add_a_measurement_then_verify_and_never_overwrite(research, report):
    added = evidence.add(research, report, "prefix-head-cpu")
    assert added == ["evidence/prefix-head-cpu/measurements/again.json"]
    assert (research / added[0]).read_bytes() == report.read_bytes()  # copied unchanged
    assert evidence.read_sums(research)[added[0]] == evidence.sha256_file(report)
    assert failures(research) == []
    with pytest.raises(UserError, match="never overwritten"):
        evidence.add(research, report, "prefix-head-cpu")
    # A changed byte in the measurement fails, naming it.
    path = research / added[0]
    path.write_bytes(path.read_bytes().replace(b'"ratio": ', b'"ratio":  ', 1))
    (bad,) = failures(research)
    assert bad.file == added[0] and "SHA-256 differs" in bad.detail
    with pytest.raises(UserError, match="does not verify"):
        evidence.add(research, report, "prefix-head-cpu")


def test_a_measurement_is_told_by_its_content_and_checked_against_its_schema(research, report):
    doc = json.loads(report.read_text())
    assert evidence.measurement_task(doc) == "head-bench"
    del doc["device"]["cpu_model"]
    with pytest.raises(UserError, match=r"\$\.device: 'cpu_model' is required"):
        evidence.add(research, _write(report, doc), "prefix-head-cpu")
    rel = "evidence/prefix-head-cpu/measurements/again.json"
    assert failures(research) == [] and not (research / rel).exists()
    # One that is invalid inside the evidence fails `verify` even with its hash updated.
    _write(research / rel, doc)
    _resum(research, rel)
    (bad,) = failures(research)
    assert bad.file == rel and bad.detail.startswith("(head-bench) $.device: 'cpu_model' is required")
    # Anything else in measurements/ (here a comparison) names what a measurement must be.
    comparison = research / "evidence/tiny-cpu-aa/comparisons/tiny-cpu-aa.json"
    shutil.copyfile(comparison, research / rel)
    _resum(research, rel)
    (bad,) = failures(research)
    assert bad.file == rel and bad.detail == "neither a head-bench nor a head-study report"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"repeats": 3}, "made with repeats 3, but study 'prefix-head-cpu' froze 20"),
        ({"rows": [1, 8]}, "made with rows 1,8, but study 'prefix-head-cpu' froze 1,8,16"),
        ({"fallback": [0.0, 0.5]}, "made with fallback 0,0.5, but study 'prefix-head-cpu' froze 0,0.1,0.45"),
        ({"device": "cuda"}, "made with device cuda, but study 'prefix-head-cpu' froze cpu"),
    ],
)
def test_a_measurement_must_match_the_frozen_options(research, report, change, message):
    doc = json.loads(report.read_text())
    doc["config"].update(change)
    with pytest.raises(UserError) as err:
        evidence.add(research, _write(report, doc), "prefix-head-cpu")
    assert err.value.message == message
    # The same check holds inside the evidence, hash updated or not.
    rel = "evidence/prefix-head-cpu/measurements/again.json"
    _write(research / rel, doc)
    _resum(research, rel)
    (bad,) = failures(research)
    assert bad.file == rel and bad.detail == f"(head-bench) {message}"


def test_measurement_and_comparison_studies_keep_their_own_kinds(tmp_path, research, report):
    with pytest.raises(UserError, match="'tiny-cpu-aa' is a comparison study") as err:
        evidence.add(research, report, "tiny-cpu-aa")
    assert "measurement study" in err.value.render()
    run = make_run(tmp_path / "runs" / "r1", seed=1)
    with pytest.raises(
        UserError, match="'prefix-head-cpu' is a measurement study: it keeps head-bench reports"
    ):
        evidence.add(research, run, "prefix-head-cpu")
    # `compare --study` needs the frozen admission rule of a comparison study.
    with pytest.raises(UserError, match="'prefix-head-gpu' is a measurement study, not a comparison study"):
        evidence.load_study("prefix-head-gpu", research)
    assert evidence.load_study("prefix-head-gpu", research, kind=None)["measurement"]["task"] == "head-bench"
    assert failures(research) == []


def test_a_head_study_result_is_a_measurement_too(research, tmp_path):
    protocol = yaml.safe_load((research / "studies" / "prefix-head-cpu.yaml").read_text())
    protocol.update(
        name="captured-head", measurement={"task": "head-study", "options": {"k": 64}, "result": "r"}
    )
    (research / "studies" / "captured-head.yaml").write_text(yaml.safe_dump(protocol))
    _resum(research, "studies/captured-head.yaml")  # a new protocol's line is added by hand
    quantiles = {"min": 0.0, "p10": 0.0, "median": 1.0, "p90": 2.0, "max": 2.0, "n": 3}
    doc = {
        "schema_version": 1,
        "run": "r1",
        "k": 64,
        "group_size": 64,
        "dtype": "bfloat16",
        "vocab": 500,
        "hidden_size": 64,
        "calls": 3,
        "rows": 9,
        "certified": 8,
        "uncertified_relevant": 1,
        "uncertified_irrelevant": 0,
        "fallback_rowwise": 2,
        "fallback_prefix": 1,
        "ties": 0,
        "disagreements": 0,
        "certified_fraction": 8 / 9,
        "trigger_rows": {"0": 1},
        "tail_margin": quantiles,
        "head_margin": quantiles,
        "k_needed": None,
    }
    assert schema.problems(doc, "head-study") == [] and evidence.measurement_task(doc) == "head-study"
    added = evidence.add(research, _write(tmp_path / "study.json", doc), "captured-head")
    assert added == ["evidence/captured-head/measurements/study.json"] and failures(research) == []
    with pytest.raises(UserError, match="made with k 32, but study 'captured-head' froze 64"):
        evidence.add(research, _write(tmp_path / "k32.json", {**doc, "k": 32}), "captured-head")
    with pytest.raises(UserError, match="a head-bench report, but study 'captured-head' measures head-study"):
        evidence.add(research, RESEARCH / CPU_REPORT, "captured-head")


def test_add_task_for_a_measurement(research, report):
    result = cli("evidence.add", str(report), "--study", "prefix-head-cpu", "--root", str(research))
    assert result.returncode == 0, result.stderr
    assert "added 1 file(s) under" in result.stdout
    assert cli("evidence.verify", "--root", str(research)).returncode == 0
    wrong = cli("evidence.add", str(report), "--study", "prefix-head-gpu", "--root", str(research))
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert "froze cuda" in wrong.stderr


def test_study_kinds_in_the_study_schema():
    aa = yaml.safe_load((RESEARCH / "studies" / "tiny-cpu-aa.yaml").read_text())
    cpu = yaml.safe_load((RESEARCH / "studies" / "prefix-head-cpu.yaml").read_text())
    assert schema.problems(aa, "study") == [] and schema.problems(cpu, "study") == []
    assert schema.problems({**aa, "kind": "comparison"}, "study") == []
    # A comparison study needs its runs, inputs and admission rule; a measurement study its `measurement`.
    no_admission = {k: v for k, v in aa.items() if k != "admission"}
    (problem,) = schema.problems(no_admission, "study")
    assert (problem.path, problem.message.split(";")[0]) == ("$", "'admission' is required but missing")
    no_section = {k: v for k, v in cpu.items() if k != "measurement"}
    messages = [p.message for p in schema.problems(no_section, "study")]
    assert any("a measurement study needs a `measurement` section" in m for m in messages)
    no_kind = {k: v for k, v in cpu.items() if k != "kind"}
    assert [p.message for p in schema.problems(no_kind, "study")] == [
        "'kind' is required but missing; fix: add 'kind': 'measurement'"
    ]


def test_the_gpu_check_script_runs_the_frozen_gpu_protocol():
    """tests/gpu/gpu_check.sh makes the report prefix-head-gpu froze, tries `evidence.add` and prints its line."""
    script = (ROOT / "tests" / "gpu" / "gpu_check.sh").read_text()
    options = evidence.load_study("prefix-head-gpu", RESEARCH, kind=None)["measurement"]["options"]
    (bench,) = [line for line in script.splitlines() if "invoke head-bench" in line and "--output" in line]
    assert f"--device {options['device']}" in bench and f"--repeats {options['repeats']} " in bench
    # The study froze the task's defaults for vocab, rows, fallback and hidden.
    assert not {"--vocab", "--rows", "--fallback", "--hidden"} & set(bench.split())
    from draftscope.cli.head import head_bench

    defaults = {k: p.default for k, p in inspect.signature(head_bench.body).parameters.items()}
    for key in ("vocab", "rows", "fallback"):
        assert evidence._same_option(options[key], [float(x) for x in defaults[key].split(",")]), key
    assert defaults["hidden"] == options["hidden"]
    assert "STUDY=prefix-head-gpu" in script
    assert 'evidence.add "$OUT/$REPORT" --study "$STUDY" --root /tmp/research-check' in script
    assert 'echo "  invoke evidence.add $OUT/$REPORT --study $STUDY"' in script


# --- claims.yaml ---------------------------------------------------------------------------------------------

# Every figure of the historical document's "Preserved research evidence" table, by claim.
HISTORICAL = {
    "int4-dflash2-six-case-medians": {6, 105.05, 171.34, 157.92, 241.42},
    "prefix-fallback-captured-head": {33, 9, 78, 72.7},
    "compiled-prefix-head-latency": {18.95, 72, 8, 10},
    "whole-model-v8-request-latency": {0.922, 1},
    "v8-sequence-checks": {30, 60, 12},
    "held-out-task-quality": set(),
}


@pytest.fixture(scope="module")
def claims():
    return yaml.safe_load((RESEARCH / "claims.yaml").read_text())


def test_claims_validate_against_their_schema(claims):
    assert schema.problems(claims, "claims") == []


def test_every_historical_figure_is_there_with_provenance_and_status(claims):
    by_id = {c["id"]: c for c in claims["claims"] if c["origin"] == "historical"}
    assert set(by_id) == set(HISTORICAL)
    for cid, figures in HISTORICAL.items():
        claim = by_id[cid]
        assert {f["value"] for f in claim["figures"]} == figures, cid
        assert claim["status"] == "reported" and claim["provenance"]["reproduced_here"] is False
        assert claim["provenance"]["hardware"] == "one NVIDIA A100-SXM4-80GB"
        assert "original" in claim["provenance"]["reported_by"]
        assert len(claim["what_would_reproduce_it"]) > 40
    assert by_id["whole-model-v8-request-latency"]["conclusion"] == "not_admitted"
    assert by_id["held-out-task-quality"]["conclusion"] == "inconclusive"


def test_a_reproduced_claim_needs_evidence(claims):
    historical = next(c for c in claims["claims"] if c["origin"] == "historical")
    claim = dict(historical, status="reproduced")
    doc = {**claims, "claims": [claim]}
    paths = {p.path for p in schema.problems(doc, "claims")}
    assert "$.claims[0].evidence" in paths or "$.claims[0].provenance.reproduced_here" in paths


def test_a_claim_citing_missing_evidence_fails(research):
    path = research / "claims.yaml"
    path.write_text(path.read_text().replace("evidence: []", "evidence: [evidence/none/runs/x]", 1))
    sums = evidence.read_sums(research)
    sums["claims.yaml"] = evidence.sha256_file(path)
    evidence.write_sums(research, sums)
    (bad,) = failures(research)
    assert bad.file == "claims.yaml" and "cites missing evidence evidence/none/runs/x" in bad.detail


def _scrub_tool():
    spec = importlib.util.spec_from_file_location(
        "scrub_host_paths", RESEARCH / "tools" / "scrub_host_paths.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _evidence_targets(root):
    runs = sorted(p for p in root.glob("evidence/*/runs/*") if p.is_dir())
    return [*runs, *sorted(root.glob("evidence/*/measurements/*.json"))]


def test_committed_evidence_names_no_host_path(capsys):
    """Every run and measurement under research/evidence passed through the share rewrite (tools/scrub_host_paths):
    another rewrite changes nothing, so no interpreter, checkout, temporary or site-packages path of the machine
    that ran it is left."""
    targets = _evidence_targets(RESEARCH)
    assert len(targets) >= 10
    assert _scrub_tool().main(["--check", *map(str, targets)]) == 0, capsys.readouterr().err


def test_the_host_path_check_catches_a_planted_path(research, capsys):
    run = next(p for p in _evidence_targets(research) if (p / "logs").is_dir())
    log = next((run / "logs").glob("*.log"))
    log.write_text(
        log.read_text(encoding="utf-8") + "loaded from /opt/someone/venv/lib/site.py\n", encoding="utf-8"
    )
    tool = _scrub_tool()
    assert tool.main(["--check", str(run)]) == 1
    assert f"{log}: names a host path" in capsys.readouterr().err
    assert tool.main([str(run)]) == 0
    assert log.read_text(encoding="utf-8").endswith("loaded from …/site.py\n")
    assert tool.main(["--check", str(run)]) == 0
