"""regen as a job array, without a cluster: the shard split (every row in exactly one shard, spread over the
shard's own instances), and the merge job — rows and errors in input order as the shards wrote them, a
schema-valid summary, and a stage that does not complete when a shard did not or a row is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import JsonlAppender, atomic_write_json, read_json
from draftscope.core.schema import problems
from draftscope.execute.slurm import states
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.batch import shards
from draftscope.pipeline.config import load_pipeline_config
from draftscope.pipeline.stages.regen.client import Row, shard_rows

ROWS = 7


def test_every_row_lands_in_exactly_one_shard_in_input_order():
    rows = [Row(k, f"r{k}", {}) for k in range(23)]
    for n in range(1, 6):
        parts = [shard_rows(rows, i, n) for i in range(n)]
        assert sorted(r.id for p in parts for r in p) == sorted(r.id for r in rows)
        for i, part in enumerate(parts):
            assert [r.id for r in part] == [f"r{k}" for k in range(i, 23, n)]
            # renumbered: the shard's rows spread over its own instances (row j → instance j mod N)
            assert [r.position for r in part] == list(range(len(part)))
    assert shard_rows(rows[:2], 3, 4) == []  # more shards than rows: an empty shard
    with pytest.raises(UserError, match="--shard I needs --shards N"):
        shard_rows(rows, 2, 2)
    with pytest.raises(UserError):
        shard_rows(rows, 0, None)


@pytest.fixture
def run(tmp_path):
    chat = tmp_path / "chat.jsonl"
    with chat.open("w") as handle:
        for k in range(ROWS):
            handle.write(
                json.dumps({"id": f"c{k}", "messages": [{"role": "user", "content": f"q{k}"}]}) + "\n"
            )
    resolved = load_pipeline_config(preset="tiny", opts=[f"data.chat={chat}"])
    plan = planning.build(resolved, registry.select("regen"), tmp_path / "w", "local")
    return plan


def write_shard(plan, i, n, *, error_ids=(), drop=(), status="completed", outcome=True):
    """What shard i's regen client and task write: rows as JsonlAppender writes them, in completion order."""
    from draftscope.pipeline.stages.regen.client import read_rows

    rows = shard_rows(read_rows(plan.context.inputs["chat"]), i, n)
    folder = shards.output_dir(plan.workdir, i)
    folder.mkdir(parents=True, exist_ok=True)
    (plan.workdir / "stages").mkdir(exist_ok=True)
    with JsonlAppender(folder / "rows.jsonl") as ok, JsonlAppender(folder / "errors.jsonl") as errors:
        for row in reversed(rows):  # not in input order: the merge puts them back in order
            if row.id in drop:
                continue
            if row.id in error_ids:
                errors.append(
                    {"id": row.id, "instance": 0, "status": 500, "attempts": 6, "error": "HTTP 500"}
                )
            else:
                ok.append(
                    {
                        "id": row.id,
                        "messages": [{"role": "assistant", "content": f"a-{row.id}"}],
                        "regen": {"instance": 0, "attempts": 1},
                    }
                )
    atomic_write_json(
        folder / "summary.json",
        {
            "schema_version": 1,
            "input": len(rows),
            "ok": len(rows) - len(error_ids),
            "errors": len(error_ids),
            "missing": [],
            "instances": [{"index": 0, "url": f"http://127.0.0.1:{8100 + i}", "rows": len(rows)}],
            "sampling": {"model": "target", "max_tokens": 64, "temperature": 0.0, "seed": 0},
        },
    )
    atomic_write_json(
        shards.result_path(plan.workdir, i),
        {
            "schema_version": 1,
            "stage": "regen",
            "exit_code": 0,
            "seconds": 1.0,
            "versions": {"torch": "x"},
            "counts": {"ok": len(rows), "retries": 2, "resumed": 1},
            "notes": [],
        },
    )
    if outcome:
        path = shards.outcome_path(plan.workdir, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            path,
            {
                "shard": i,
                "shards": n,
                "status": status,
                "seconds": 3.0 + i,
                "reason": None if status == "completed" else "job 9_1 reached its limit",
                "job_id": f"9_{i}",
                "array_job_id": "9",
            },
        )


def test_the_merge_writes_the_stage_outputs_in_input_order(run):
    for i in range(3):
        write_shard(run, i, 3, error_ids={"c4"})
    sp = run.stages[0]
    outcome = shards.merged_outcome(run, sp, 3, "10")
    assert outcome.status == "completed", outcome.reason
    assert outcome.seconds >= 5.0  # the longest shard, plus the merge
    out = run.workdir / "regen"
    ids = [json.loads(line)["id"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert ids == ["c0", "c1", "c2", "c3", "c5", "c6"]
    assert [json.loads(line)["id"] for line in (out / "errors.jsonl").read_text().splitlines()] == ["c4"]
    line = (shards.output_dir(run.workdir, 0) / "rows.jsonl").read_text().splitlines()[0]
    assert line in (out / "rows.jsonl").read_text().splitlines()  # each line as its shard wrote it
    summary = read_json(out / "summary.json")
    assert problems(summary, "stage-regen") == []
    assert (summary["input"], summary["ok"], summary["errors"]) == (ROWS, ROWS - 1, 1)
    assert [i["index"] for i in summary["instances"]] == [0, 1, 2]
    result = read_json(run.workdir / "stages" / "regen.result.json")
    assert result["counts"] == {
        "input": ROWS,
        "ok": ROWS - 1,
        "errors": 1,
        "shards": 3,
        "retries": 6,
        "resumed": 3,
    }
    assert result["versions"] == {"torch": "x"} and "job array 9 of 3 shard(s)" in result["notes"][0]


def test_a_shard_that_did_not_complete_fails_the_stage_with_its_reason(run):
    write_shard(run, 0, 2)
    write_shard(run, 1, 2, status="timed_out")
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert outcome.status == "timed_out"
    assert outcome.reason == "shard 1 of 2 (job 9_1): timed_out: job 9_1 reached its limit"
    assert not (run.workdir / "regen" / "rows.jsonl").exists()


def test_a_shard_killed_before_it_recorded_fails_the_stage(run, monkeypatch):
    from draftscope.execute.slurm import client

    monkeypatch.setattr(client, "show", lambda job_id: None)  # Slurm no longer knows the array (MinJobAge)
    write_shard(run, 0, 2)
    write_shard(run, 1, 2, outcome=False)
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert outcome.status == "failed" and "shard 1 of 2 ended without recording how" in outcome.reason
    assert "slurm-regen-9_<shard>.out" in outcome.reason


def test_a_shard_killed_after_it_started_is_explained_by_slurms_record_of_its_task(run, monkeypatch):
    """Slurm's SIGKILL (KillWait after its SIGTERM) can beat the task's own record: the `running` record it wrote
    before its step started names the array, and the merge job asks Slurm how each such task ended."""
    from draftscope.execute.slurm import client

    write_shard(run, 0, 2, status="running")
    write_shard(run, 1, 2, outcome=False)  # cancelled while still pending: no record at all
    asked = []

    def show(job_id):
        asked.append(job_id)
        return [
            states.JobState(f"9_{i}", "CANCELLED", exit_code="0:15", array_job_id="9", array_task=str(i))
            for i in (0, 1)
        ]

    monkeypatch.setattr(client, "show", show)
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert asked == ["9"] and outcome.status == "interrupted"
    assert outcome.reason.startswith(
        "shard 0 of 2 ended before it recorded how: job 9_0 was cancelled (scancel)"
    )
    assert outcome.reason.endswith("; 1 more shard(s) did not complete")
    # Slurm no longer answering (or knowing the job) leaves the plain account
    monkeypatch.setattr(client, "show", lambda job_id: None)
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert outcome.status == "failed" and "shard 0 of 2 ended without recording how" in outcome.reason


def test_task_indices_read_every_form_of_array_task_id():
    assert states.task_indices("3") == [3]
    assert states.task_indices("0-3") == [0, 1, 2, 3]
    assert states.task_indices("0,2-3") == [0, 2, 3]
    assert states.task_indices("0-7%2") == list(range(8))  # a throttle
    assert states.task_indices("") == [] and states.task_indices("N/A") == []


def test_an_array_cancelled_before_any_task_started_is_named_from_the_ledger(run, monkeypatch):
    """No task wrote anything: the ledger's submission that holds this merge job names the array, and Slurm's
    record of its still-pending range says what happened to every task."""
    from draftscope.execute.slurm import client

    ledger = {
        "schema_version": 1,
        "submissions": [
            {
                "jobs": [{"key": "regen", "stage": "regen", "kind": "shards", "job_id": "7"}]
            },  # an earlier submission
            {
                "jobs": [
                    {"key": "regen", "stage": "regen", "kind": "shards", "job_id": "9"},
                    {"key": "regen.merge", "stage": "regen", "kind": "merge", "job_id": "10"},
                ]
            },
        ],
    }
    (run.workdir / "slurm").mkdir(parents=True)
    atomic_write_json(run.workdir / "slurm" / "jobs.json", ledger)
    asked = []

    def show(job_id):
        asked.append(job_id)
        return [states.JobState("9_[0-1]", "CANCELLED", array_job_id="9", array_task="0-1")]

    monkeypatch.setattr(client, "show", show)
    monkeypatch.setenv("SLURM_JOB_ID", "10")
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert asked == ["9"] and outcome.status == "interrupted"
    assert outcome.reason.startswith("shard 0 of 2 left no record: job 9_[0-1] was cancelled (scancel); see ")
    assert "slurm-regen-9_<shard>.out" in outcome.reason and outcome.reason.endswith(
        "1 more shard(s) did not complete"
    )
    # A merge job the ledger does not know (run by hand): nothing to ask about, the plain account
    monkeypatch.setenv("SLURM_JOB_ID", "11")
    outcome = shards.merged_outcome(run, run.stages[0], 2, "11")
    assert asked == ["9"] and outcome.status == "failed"
    assert (
        "shard 0 of 2 ended without recording how" in outcome.reason
        and "slurm-regen-?_<shard>" in outcome.reason
    )


def test_finished_shards_are_not_asked_about(run, monkeypatch):
    from draftscope.execute.slurm import client

    monkeypatch.setattr(client, "show", lambda job_id: pytest.fail("asked Slurm"))
    write_shard(run, 0, 2)
    write_shard(run, 1, 2, status="timed_out")
    assert shards.merged_outcome(run, run.stages[0], 2, "10").status == "timed_out"


def test_a_missing_row_fails_the_stage(run):
    write_shard(run, 0, 2, drop={"c2"})
    write_shard(run, 1, 2)
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert (
        outcome.status == "failed" and "shard 0: 1 row(s) have neither a reply nor an error" in outcome.reason
    )


def test_a_row_in_the_wrong_shard_fails_the_stage(run):
    write_shard(run, 0, 2)
    write_shard(run, 1, 2)
    with (shards.output_dir(run.workdir, 1) / "rows.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "c0", "messages": []}) + "\n")  # c0 belongs to shard 0
    outcome = shards.merged_outcome(run, run.stages[0], 2, "10")
    assert outcome.status == "failed" and "not in the input" in outcome.reason


def test_the_paths_of_a_shard_are_its_own(tmp_path: Path):
    paths = {
        shards.output_dir(tmp_path, 1),
        shards.outcome_path(tmp_path, 1),
        shards.commands_path(tmp_path, 1),
        shards.result_path(tmp_path, 1),
    }
    others = {
        shards.output_dir(tmp_path, 2),
        shards.outcome_path(tmp_path, 2),
        shards.commands_path(tmp_path, 2),
        shards.result_path(tmp_path, 2),
    }
    assert len(paths | others) == 8


def test_the_merge_job_records_the_shards_image_without_a_container_engine(tmp_path, monkeypatch):
    """A merge job's node may have no engine: the record's image facts are those the shards read where they ran,
    and its command is the stage's own (so a resubmission skips it)."""
    from draftscope.pipeline.batch import commands as node
    from draftscope.pipeline.batch import jobs, planfile
    from draftscope.runtime import get_runtime

    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "".join(
            json.dumps({"id": f"c{k}", "messages": [{"role": "user", "content": "q"}]}) + "\n"
            for k in range(ROWS)
        )
    )
    resolved = load_pipeline_config(preset="tiny", opts=[f"data.chat={chat}", "slurm.stages.regen.shards=2"])
    plan = planning.build(resolved, registry.select("regen"), tmp_path / "w", "podman")
    jp = jobs.build(plan, get_runtime("podman"), python="python")
    path = planfile.write(jp, force=False)
    facts = {"reference": "localhost/draftscope-vllm:0.1.0", "id": "sha256:abc", "repo_digests": []}
    for i in range(2):
        write_shard(plan, i, 2)
        outcome = read_json(shards.outcome_path(plan.workdir, i))
        atomic_write_json(shards.outcome_path(plan.workdir, i), {**outcome, "image": facts})
    monkeypatch.setenv("PATH", str(tmp_path / "no-engine-here"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    said: list[str] = []
    assert node.merge(path, "regen", say=said.append) == 0, said
    record = read_json(plan.workdir / "stages" / "regen.json")
    assert record["status"] == "completed" and record["image"] == {"name": "vllm", **facts}
    assert record["slurm"] == {"job_id": "77", "nodes": None, "array_job_id": "9", "shards": 2}
    assert record["argv"][:2] == ["podman", "run"] and not any("running in" in line for line in said)
    assert jobs.skip_reason(plan.workdir, plan.stages[0], get_runtime("podman")) is not None
