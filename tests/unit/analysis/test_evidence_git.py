"""Evidence a reviewer can trust (issue 19, acceptance 4): through git history, a study's protocol is committed
before its results and each result is measured from a clean commit holding it; `evidence.add` refuses a dirty
checkout and a dirty run; evidence made before these rules is listed as superseded, never rewritten."""

import json
import os
import shutil
import subprocess

import pytest
from test_analysis_synthetic import make_run

from draftscope.analysis import evidence
from draftscope.core import rundir
from draftscope.core.errors import UserError

from support import ROOT

STUDY = "tiny-cpu-aa"
PROTOCOL = ROOT / "research" / "studies" / f"{STUDY}.yaml"
ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_AUTHOR_DATE": "2026-12-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-12-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo, *args):
    env = {**os.environ, **ENV}
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def commit(repo, message):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--no-gpg-sign", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def resum(research):
    evidence.write_sums(
        research, {rel: evidence.sha256_file(research / rel) for rel in evidence.summed_files(research)}
    )


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "research").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("kit\n")
    resum(repo / "research")
    commit(repo, "the kit")
    return repo


def protocol(repo):
    (repo / "research" / "studies").mkdir(exist_ok=True)
    shutil.copyfile(PROTOCOL, repo / "research" / "studies" / f"{STUDY}.yaml")
    resum(repo / "research")


def measured(tmp_path, monkeypatch, at, *, dirty=False, name="aa-1"):
    """A run made from commit `at` of the repository (clean unless `dirty`)."""
    kit = {"version": "0.1.0", "git_commit": at, "git_dirty": dirty}
    monkeypatch.setattr(rundir, "kit_info", lambda: dict(kit))
    return make_run(tmp_path / "runs" / name, seed=1)


def placed(repo, run):
    """A run copied into the evidence by hand, as a careless contributor might (add would refuse a dirty one)."""
    shutil.copytree(run, repo / "research" / "evidence" / STUDY / "runs" / run.name)
    resum(repo / "research")


def failed(research, **kw):
    return [f for f in evidence.verify(research, **kw) if not f.ok]


def test_a_protocol_committed_before_its_clean_results_verifies(repo, tmp_path, monkeypatch):
    protocol(repo)
    frozen = commit(repo, "protocol")
    run = measured(tmp_path, monkeypatch, frozen)
    evidence.add(repo / "research", run, STUDY)
    commit(repo, "results")
    findings = evidence.verify(repo / "research")
    assert [f.line() for f in findings if not f.ok] == []
    (order,) = [f for f in findings if f.file == f"studies/{STUDY}.yaml" and "git history" in f.detail]
    assert order.line().startswith(f"ok   studies/{STUDY}.yaml (git history) committed before its")


def test_a_protocol_committed_with_its_results_fails_naming_the_run(repo, tmp_path, monkeypatch):
    run = measured(tmp_path, monkeypatch, git(repo, "rev-parse", "HEAD"))
    protocol(repo)
    placed(repo, run)
    together = commit(repo, "protocol and results")
    found = failed(repo / "research")
    assert [f.file for f in found] == [
        f"evidence/{STUDY}/runs/aa-1",
        f"evidence/{STUDY}/runs/aa-1/manifest.json",
    ]
    assert f"added in {together[:12]}, the same commit as its protocol" in found[0].detail
    assert "does not contain its protocol" in found[1].detail  # the run's commit had no protocol yet


def test_a_protocol_committed_after_its_results_fails(repo, tmp_path, monkeypatch):
    run = measured(tmp_path, monkeypatch, git(repo, "rev-parse", "HEAD"))
    placed(repo, run)
    commit(repo, "results")
    protocol(repo)
    later = commit(repo, "protocol")
    found = failed(repo / "research")
    assert found[0].file == f"evidence/{STUDY}/runs/aa-1"
    assert f"not after its protocol's commit {later[:12]}" in found[0].detail


def test_a_protocol_changed_after_its_results_fails(repo, tmp_path, monkeypatch):
    protocol(repo)
    frozen = commit(repo, "protocol")
    evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen), STUDY)
    commit(repo, "results")
    path = repo / "research" / "studies" / f"{STUDY}.yaml"
    path.write_text(path.read_text() + "# a later thought\n")
    resum(repo / "research")
    changed = commit(repo, "protocol edited")
    found = failed(repo / "research")
    assert f"not after its protocol's commit {changed[:12]}" in found[0].detail


def test_a_dirty_tree_result_fails_naming_the_field(repo, tmp_path, monkeypatch):
    protocol(repo)
    frozen = commit(repo, "protocol")
    placed(repo, measured(tmp_path, monkeypatch, frozen, dirty=True))
    commit(repo, "results")
    (found,) = failed(repo / "research")
    assert found.file == f"evidence/{STUDY}/runs/aa-1/manifest.json"
    assert "$.kit.git_dirty is true: not measured from a clean tree" in found.detail


def test_add_refuses_a_dirty_checkout_and_a_dirty_run(repo, tmp_path, monkeypatch):
    protocol(repo)
    frozen = commit(repo, "protocol")
    (repo / "notes.txt").write_text("uncommitted\n")
    with pytest.raises(UserError, match=r"uncommitted changes \(1 path\(s\), first: notes.txt\)"):
        evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen), STUDY)
    (repo / "notes.txt").unlink()
    evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen, name="aa-3"), STUDY)
    # What add wrote (new evidence, SHA256SUMS) is not a dirty checkout: results are added, then committed together.
    evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen, name="aa-4"), STUDY)
    (repo / "research" / "studies" / f"{STUDY}.yaml").write_text("edited\n")
    with pytest.raises(UserError, match=f"first: research/studies/{STUDY}.yaml"):
        evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen, name="aa-5"), STUDY)
    git(repo, "checkout", "--", f"research/studies/{STUDY}.yaml")
    dirty = measured(tmp_path, monkeypatch, frozen, dirty=True, name="aa-2")
    with pytest.raises(
        UserError, match=r"\$\.kit\.git_dirty: made from a dirty tree.*\(got 'true'\)"
    ) as caught:
        evidence.add(repo / "research", dirty, STUDY)
    assert "commit every change" in str(caught.value)
    assert "aa-2" not in git(repo, "status", "--porcelain", "--untracked-files=all")  # nothing was copied


def test_superseded_evidence_is_kept_and_reported_not_counted(repo, tmp_path, monkeypatch):
    run = measured(tmp_path, monkeypatch, git(repo, "rev-parse", "HEAD"), dirty=True)
    protocol(repo)
    placed(repo, run)
    commit(repo, "protocol and results")
    (repo / "research" / "SUPERSEDED.yaml").write_text(
        f"superseded:\n  - path: evidence/{STUDY}\n    date: 2026-12-02\n    reason: made before the rules\n"
    )
    resum(repo / "research")
    commit(repo, "superseded")
    findings = evidence.verify(repo / "research")
    assert [f.line() for f in findings if not f.ok] == []
    (kept,) = [f for f in findings if f.tag == "superseded"]
    assert kept.line().startswith(
        f"superseded evidence/{STUDY}: 2026-12-02: made before the rules (2 history"
    )
    (repo / "research" / "SUPERSEDED.yaml").write_text("superseded:\n  - path: evidence/nope\n")
    resum(repo / "research")
    bad = failed(repo / "research")  # an invalid list supersedes nothing: the evidence's problems fail again
    assert bad[0].file == "SUPERSEDED.yaml" and "$.superseded[0]" in bad[0].detail
    assert {f.file for f in bad[1:]} == {
        f"evidence/{STUDY}/runs/aa-1",
        f"evidence/{STUDY}/runs/aa-1/manifest.json",
    }


def test_a_study_re_measured_under_the_rules_counts_its_new_results_only(repo, tmp_path, monkeypatch):
    old = measured(tmp_path, monkeypatch, git(repo, "rev-parse", "HEAD"), dirty=True)
    protocol(repo)
    placed(repo, old)
    (repo / "research" / "SUPERSEDED.yaml").write_text(
        f"superseded:\n  - path: evidence/{STUDY}/runs/aa-1\n    date: 2026-12-02\n    reason: before the rules\n"
    )
    resum(repo / "research")
    frozen = commit(repo, "protocol, old results, superseded")
    evidence.add(repo / "research", measured(tmp_path, monkeypatch, frozen, name="aa-new"), STUDY)
    commit(repo, "re-measured")
    findings = evidence.verify(repo / "research")
    assert [f.line() for f in findings if not f.ok] == []
    (order,) = [f for f in findings if f.file == f"studies/{STUDY}.yaml" and "git history" in f.detail]
    new_files = len(list((repo / "research" / "evidence" / STUDY / "runs" / "aa-new").rglob("*.*")))
    assert order.detail == f"(git history) committed before its {new_files} result file(s)"
    (kept,) = [f for f in findings if f.tag == "superseded"]
    assert kept.file == f"evidence/{STUDY}/runs/aa-1" and "(2 history problem(s)" in kept.detail


def test_without_git_history_verify_warns_and_fails_when_strict(tmp_path):
    research = tmp_path / "research"
    shutil.copytree(ROOT / "research", research)
    (warned,) = [f for f in evidence.verify(research) if f.tag == "warn"]
    assert warned.ok and warned.line().startswith("warn git history: not checked: research/ is not in a git")
    (found,) = failed(research, strict=True)
    assert found.file == "git history" and found.line().startswith("FAIL git history: not checked")


def test_the_committed_evidence_marks_the_old_studies_superseded():
    findings = evidence.verify(ROOT / "research")
    assert [f.line() for f in findings if not f.ok] == []
    kept = {f.file.split("/")[1] for f in findings if f.tag == "superseded"}
    assert kept == {"tiny-cpu-aa", "tiny-cpu-reproduce", "prefix-head-cpu"}
    assert sum(f.tag == "superseded" for f in findings) == 9  # each run directory and file, not the studies
    data = json.dumps([f.line() for f in findings])
    assert (
        "studies/vllm-cpu-exactness.yaml (git history) committed before" in data or "warn git history" in data
    )
