"""research/: the committed evidence verifies, one changed byte anywhere fails naming the file, `add` never
overwrites, and claims.yaml carries every historical figure with its provenance (issue 5, acceptance 4 and 5)."""

import shutil

import pytest
import yaml
from test_analysis_report import cli
from test_analysis_synthetic import make_run

from draftscope import schema
from draftscope.analysis import evidence
from draftscope.analysis.compare import compare_runs, write_comparison
from draftscope.analysis.load import load_run
from draftscope.errors import UserError

from support import ROOT

RESEARCH = ROOT / "research"


def failures(root):
    return [f for f in evidence.verify(root) if not f.ok]


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


def test_add_task(tmp_path, research):
    run = make_run(tmp_path / "r1", seed=3)
    result = cli("evidence.add", str(run), "--study", "tiny-cpu-aa", "--root", str(research))
    assert result.returncode == 0, result.stderr
    assert cli("evidence.verify", "--root", str(research)).returncode == 0
    again = cli("evidence.add", str(run), "--study", "tiny-cpu-aa", "--root", str(research))
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1


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
    by_id = {c["id"]: c for c in claims["claims"]}
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
    claim = dict(claims["claims"][0], status="reproduced")
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
