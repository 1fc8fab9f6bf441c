import json
import os
import shutil

import pytest

from draftscope.core.rundir import RunDir
from draftscope.core.summary import summarize
from draftscope.core.validate import validate_run
from draftscope.ops.validate import validate_path

SHA = "a" * 64


def record(i=0, repeat=0):
    return {
        "schema_version": 1,
        "prompt_id": f"p{i}",
        "prompt_sha256": SHA,
        "repeat": repeat,
        "prompt_tokens": 5,
        "generated_token_ids": [1, 2, 3],
        "generated_tokens": 3,
        "request_seconds": 0.5,
        "request_tok_s": 6.0,
        "decode_tok_s": 8.0,
        "token_timestamps": [0.1, 0.35, 0.35],
        "timing_source": "test",
        "finish_reason": "length",
    }


CONFIG = {"schema_version": 1, "name": "t", "backend": "transformers", "model_preset": "tiny"}


@pytest.fixture
def completed_run(tmp_path):
    run = RunDir.create(tmp_path / "run", kind="benchmark", config=CONFIG, argv=["t"])
    run.set_status("running")
    with run.records() as out:
        run.append_record(out, record())
        run.append_record(out, record(repeat=1))
    run.write_summary(summarize("run", [record(), record(repeat=1)], ["p0"], partial=False))
    run.complete()
    return tmp_path / "run"


def test_completed_run_validates(completed_run):
    report = validate_run(completed_run)
    assert report.ok, report.first_failure()
    assert [v.file for v in report.verdicts] == ["manifest.json", "records.jsonl", "summary.json"]


def test_invalid_json_manifest_names_file_and_path(completed_run):
    path = completed_run / "manifest.json"
    path.write_text(path.read_text()[:-20])
    report = validate_run(completed_run)
    assert not report.ok
    bad = report.verdicts[0]
    assert bad.file == "manifest.json" and bad.detail.startswith("$: not valid JSON")


def test_schema_violation_names_json_path(completed_run):
    path = completed_run / "manifest.json"
    m = json.loads(path.read_text())
    m["status"] = "finished"
    m["inputs"] = [{"name": "p", "path": "x", "sha256": "nothex", "bytes": 1}]
    path.write_text(json.dumps(m))
    line = validate_run(completed_run).verdicts[0].line()
    assert line.startswith("FAIL manifest.json") and "$.inputs[0].sha256" in line


def test_config_is_checked_against_the_experiment_schema(completed_run):
    path = completed_run / "manifest.json"
    m = json.loads(path.read_text())
    m["config"]["repeats"] = -1
    path.write_text(json.dumps(m))
    assert "$.config.repeats" in validate_run(completed_run).first_failure()


def test_bad_record_line_is_named(completed_run):
    with (completed_run / "records.jsonl").open("a") as fh:
        fh.write(json.dumps({**record(), "request_seconds": -1}) + "\n")
    failure = validate_run(completed_run).first_failure()
    assert failure.startswith("records.jsonl: line 3: $.request_seconds")


def test_summary_must_agree_with_records(completed_run):
    (completed_run / "records.jsonl").write_text(json.dumps(record()) + "\n")
    assert "says 2 but records.jsonl has 1" in validate_run(completed_run).first_failure()


def test_completed_run_without_summary_fails(completed_run):
    (completed_run / "summary.json").unlink()
    assert "summary.json: missing" in validate_run(completed_run).first_failure()


def test_partial_run_without_summary_is_valid(tmp_path):
    run = RunDir.create(tmp_path / "p", kind="benchmark", config=CONFIG, argv=["t"])
    run.set_status("running")
    with run.records() as out:
        run.append_record(out, record())
    run.set_status("timed_out", "max-seconds reached")
    assert validate_run(tmp_path / "p").ok


def test_tampered_input_copy_is_detected(tmp_path):
    from draftscope.core.rundir import InputFile

    src = tmp_path / "prompts.json"
    src.write_text("{}")
    RunDir.create(
        tmp_path / "r", kind="benchmark", config=CONFIG, argv=["t"], inputs=[InputFile("prompts", src)]
    )
    (tmp_path / "r" / "inputs" / "prompts.json").write_text("{} ")
    assert "no longer has the recorded hash" in validate_run(tmp_path / "r").first_failure()


# --- Slurm files: the ledger beside a submitted benchmark run, an array task's outcome -------------------------------

JOB = {
    "key": "benchmark",
    "stage": "benchmark",
    "kind": "benchmark",
    "job_id": "12",
    "array": None,
    "dependency": None,
    "log": "slurm-benchmark-12.out",
    "status": "interrupted",
    "reason": "job 12 was cancelled (scancel) (exit code 143, on n1)",
    "tasks": [{"job_id": "12", "state": "CANCELLED", "reason": "None", "exit_code": "0:15", "nodes": "n1"}],
}
LEDGER = {
    "schema_version": 1,
    "submissions": [
        {
            "submitted_at": "2026-11-30T12:00:00Z",
            "command_line": ["invoke"],
            "runtime": "local",
            "python": "python3",
            "jobs": [JOB],
        }
    ],
}


def test_the_ledger_beside_a_submitted_run_is_validated(completed_run):
    ledger = completed_run.with_name("run.slurm") / "jobs.json"
    ledger.parent.mkdir()
    ledger.write_text(json.dumps(LEDGER))
    report = validate_run(completed_run)
    assert report.ok and report.verdicts[-1].line() == "ok   ../run.slurm/jobs.json (slurm-jobs)"
    broken = {**LEDGER, "submissions": [{**LEDGER["submissions"][0], "jobs": [{**JOB, "job_id": "12.0"}]}]}
    ledger.write_text(json.dumps(broken))
    report = validate_run(completed_run)
    assert not report.ok and report.first_failure().startswith(
        "../run.slurm/jobs.json: $.submissions[0].jobs[0].job_id: '12.0'"
    )


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"kind": "container"}, "kind"),
        ({"status": "running"}, "status"),
        ({"dependency": "after:12"}, "dependency"),
        ({"tasks": [{**JOB["tasks"][0], "exit_code": "143"}]}, "tasks[0].exit_code"),
    ],
)
def test_the_ledger_schema_refuses_what_the_kit_never_writes(change, path):
    from draftscope.core import schema

    bad = {**LEDGER, "submissions": [{**LEDGER["submissions"][0], "jobs": [{**JOB, **change}]}]}
    assert schema.problems(LEDGER, "slurm-jobs") == []
    assert [p.path for p in schema.problems(bad, "slurm-jobs")] == [f"$.submissions[0].jobs[0].{path}"]


def test_an_array_tasks_outcome_is_checked_before_it_is_written(tmp_path, monkeypatch):
    from draftscope.core.errors import UserError
    from draftscope.core.jsonio import read_json
    from draftscope.pipeline.batch import commands as node
    from draftscope.pipeline.batch import shards

    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "9")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    node._record_shard(
        tmp_path,
        "regen",
        1,
        2,
        status="running",
        reason=None,
        seconds=0.0,
        exit_code=None,
        image=None,
        started_at="2026-11-30T12:00:00Z",
    )
    written = read_json(shards.outcome_path(tmp_path, 1))
    assert written["status"] == "running" and written["job_id"] == "9_1" and written["array_job_id"] == "9"
    assert written["finished_at"] is None
    with pytest.raises(UserError, match=r"\$\.status: 'stopped' is not allowed; fix: use one of 'running'"):
        node._record_shard(
            tmp_path,
            "regen",
            1,
            2,
            status="stopped",
            reason=None,
            seconds=1.0,
            exit_code=0,
            image=None,
            started_at="2026-11-30T12:00:00Z",
        )
    assert read_json(shards.outcome_path(tmp_path, 1))["status"] == "running"  # the valid record stays


# --- a planted run directory (issue 18): clean verdicts, no hang, no "all valid" without the run's inputs -------


def _link_out(file, outside):
    outside.write_bytes(file.read_bytes())
    file.unlink()
    file.symlink_to(outside)


def _synthetic(tmp_path):
    from test_analysis_synthetic import make_run

    return make_run(tmp_path / "r", repeats=1)


@pytest.mark.parametrize(
    "plant, file, phrase",
    [
        (
            lambda r, t: (r / "records.jsonl").unlink() or os.mkfifo(r / "records.jsonl"),
            "records",
            "named pipe",
        ),
        (lambda r, t: (r / "summary.json").unlink() or (r / "summary.json").mkdir(), "summary", "a folder"),
        (lambda r, t: (r / "manifest.json").write_text("[1, 2]"), "manifest", "not of type 'object'"),
        (
            lambda r, t: (
                (r / "manifest.json").unlink() or (r / "manifest.json").symlink_to(r / "manifest.json")
            ),
            "manifest",
            "cannot be read",
        ),
        (
            lambda r, t: _link_out(r / "summary.json", t / "out.json"),
            "summary",
            "link pointing out of the run directory",
        ),
        (
            lambda r, t: shutil.rmtree(r / "inputs"),
            "manifest",
            "inputs/prompts.json is missing: the run's copy of its prompts input was deleted",
        ),
        (
            lambda r, t: (r / "inputs" / "prompts.json").unlink() or os.mkfifo(r / "inputs" / "prompts.json"),
            "manifest",
            "named pipe",
        ),
    ],
    ids=[
        "records-fifo",
        "summary-folder",
        "manifest-list",
        "manifest-loop",
        "summary-link-out",
        "inputs-gone",
        "input-fifo",
    ],
)
def test_a_planted_run_gets_clean_verdicts(tmp_path, plant, file, phrase):
    run = _synthetic(tmp_path)
    plant(run, tmp_path)
    report = validate_path(run)
    assert not report.ok
    (verdict,) = [v for v in report.verdicts if v.file.startswith(file)]
    assert not verdict.ok and phrase in verdict.detail, verdict.line()


def test_a_summarized_run_without_its_records_file_is_not_valid(tmp_path):
    """A completed run whose records.jsonl was deleted (the summary still counts them) was called valid."""
    from test_analysis_synthetic import make_run

    run = make_run(tmp_path / "r", repeats=1)
    (run / "records.jsonl").unlink()
    report = validate_run(run)
    assert not report.ok
    assert "records.jsonl" in report.first_failure() and "missing" in report.first_failure()
