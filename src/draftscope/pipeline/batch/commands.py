"""Inside a pipeline's batch job: run one stage (or one shard, or one node's part of training) through the runtime,
merge regen's shards or check hsextract's whole output after a job array, or remove a job's container.

A stage's job calls the runner's own `run_stage`, so the skip check, the preconditions, the outputs' validation
and the stage record are a local run's; the record gains an entry about the job from its launcher (`slurm`: job
id, nodes). The scheduler's SIGTERM stops the step through the runtime, before the scheduler kills the job, and the
record says why (`execute.injob.here`: a time limit is `timed_out`, anything else `interrupted`). An array task
writes a `running` outcome before its step starts, for the job after the array to go by if the task is killed
before it can write its end.

Exit status: 0 when the stage completed (or was already complete), 1 when not, 2 for a user error, 143 when
stopped before anything could be recorded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.provenance import now
from draftscope.core.schema import check as check_schema
from draftscope.execute.injob import Say, here, remove_container, say
from draftscope.pipeline import runner
from draftscope.pipeline.batch import jobs, planfile, shards
from draftscope.pipeline.plan import StagePlan
from draftscope.runtime import Context, Outcome
from draftscope.runtime.base import container_name
from draftscope.runtime.step import Step

# --- run-step ---------------------------------------------------------------------------------------------------


def run_step(
    plan_file: Path, stage: str, *, shard: int | None = None, rdzv_endpoint: str | None = None, say: Say = say
) -> int:
    loaded = planfile.load(plan_file)
    plan, runtime = loaded.plan, loaded.runtime
    node = here()
    ctx = node.job_context(plan.workdir)
    if stage == "fetch":
        step = runner.fetch_step(plan)
        if step is None:
            say("fetch: the target snapshot is already in the hub cache")
            return 0
        outcome = node.classified(runtime.run)(step, ctx)
        say(f"fetch: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
        return 0 if outcome.ok else 1
    job = loaded.job(stage)
    sp = loaded.stage(stage)
    force = bool(loaded.doc["force"])
    if job["kind"] == "shards":
        if shard is None:
            raise UserError(f"stage {stage} runs as a job array", field="--shard", fix="pass --shard I")
        return run_shard(loaded, shard, stage=stage, say=say)
    if job["kind"] == "torchrun":
        return run_torchrun(loaded, rdzv_endpoint, say=say)
    outcome = runner.run_stage(
        plan,
        sp,
        runtime,
        ctx,
        force=force,
        say=say,
        execute=node.classified(runtime.run),
        extra=node.record_entry(),
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def run_shard(loaded: planfile.Loaded, shard: int, *, stage: str = shards.STAGE, say: Say = say) -> int:
    """One task of a stage's job array (regen, hsextract): the stage's step on this shard's rows; its outcome in
    slurm/shards/<stage>/."""
    plan, runtime = loaded.plan, loaded.runtime
    sp = loaded.stage(stage)
    count = int(loaded.job(stage)["shards"])
    if not 0 <= shard < count:
        raise UserError(f"{stage} has {count} shard(s)", field="--shard", value=shard)
    node = here()
    ctx = node.job_context(plan.workdir)
    workdir = plan.workdir
    reason = jobs.skip_reason(workdir, sp, runtime)
    if reason and not loaded.doc["force"]:
        # The stage is complete with this command and these inputs (a resubmission for a later stage): the job
        # after the array skips it too, so this task starts no server.
        _record_shard(
            workdir,
            stage,
            shard,
            count,
            status="completed",
            reason=f"skipped ({reason})",
            seconds=0.0,
            exit_code=None,
            image=None,
            started_at=now(),
        )
        say(f"{stage}: shard {shard} skipped ({reason})")
        return 0
    commands = shards.shard_commands(plan.context, shard, count, stage)
    sharded = dataclasses.replace(
        sp, step=shards.shard_step(sp, plan.context, shard, count), commands=tuple(commands)
    )
    runner.stage_preconditions(sharded, plan.context)  # its input is there, its ports are free on this node
    if commands:
        atomic_write_json(
            shards.commands_path(workdir, shard, stage),
            {"schema_version": 1, "stage": stage, "commands": [c.to_dict() for c in commands]},
        )
    # The image's facts, read where it runs (the merge job's node may have no engine); a missing image fails here.
    image = runtime.image_facts(sp.step.image) if runtime.uses_images else None
    shards.result_path(workdir, shard, stage).unlink(missing_ok=True)
    (workdir / "logs" / shards.step_name(shard, stage)).mkdir(parents=True, exist_ok=True)
    if stage == shards.HSEXTRACT:
        shards.output_dir(workdir, shard, stage).mkdir(parents=True, exist_ok=True)
    say(
        f"{stage}: shard {shard} of {count}, running in "
        f"{sp.step.image if runtime.name != 'local' else 'this environment'}"
    )
    started_at = now()
    # Recorded before the step starts: a task killed before it can say how it ended (the scheduler's SIGKILL, a
    # lost node) leaves its job id, and the job after the array asks the scheduler about it.
    _record_shard(
        workdir,
        stage,
        shard,
        count,
        status="running",
        reason=None,
        seconds=0.0,
        exit_code=None,
        image=image,
        started_at=started_at,
    )
    outcome = node.classified(runtime.run)(sharded.step, ctx)
    _record_shard(
        workdir,
        stage,
        shard,
        count,
        status=outcome.status,
        reason=outcome.reason,
        seconds=outcome.seconds,
        exit_code=outcome.exit_code,
        image=image,
        started_at=started_at,
    )
    say(
        f"{stage}: shard {shard} {outcome.status}"
        + (f" ({outcome.reason})" if outcome.reason else "")
        + f" in {outcome.seconds:.1f} s"
    )
    return 0 if outcome.ok else 1


def _record_shard(
    workdir: Path,
    stage: str,
    shard: int,
    count: int,
    *,
    status: str,
    reason: str | None,
    seconds: float,
    exit_code: int | None,
    image: dict[str, Any] | None,
    started_at: str,
) -> None:
    """How an array task ended, for the job after the array: `slurm/shards/<stage>/<shard>.json`."""
    node = here()
    record = {
        "shard": shard,
        "shards": count,
        "status": status,
        "reason": reason,
        "exit_code": exit_code,
        "seconds": round(seconds, 3),
        "job_id": node.job_id(),
        "array_job_id": node.array_job_id(),
        "nodes": node.nodes(),
        "image": image,
        "started_at": started_at,
        "finished_at": None if status == "running" else now(),
    }
    path = shards.outcome_path(workdir, shard, stage)
    check_schema(record, shards.OUTCOME_SCHEMA, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)


def run_torchrun(loaded: planfile.Loaded, endpoint: str | None, *, say: Say = say) -> int:
    """One node's part of training across nodes (one task per node). Node 0 runs the stage as a whole run does and
    writes the record; the others run the same step (their torchrun joins the rendezvous)."""
    plan = loaded.plan
    config = plan.config
    if not endpoint:
        raise UserError(
            "training across nodes needs the rendezvous host",
            field="--rdzv-endpoint",
            fix="run the job script, which passes the allocation's first node",
        )
    sp = loaded.stage("train")
    shown, runtime = jobs.record_step(sp, loaded.runtime, config)
    node = here()
    count, rank, shared_id = node.spread()
    real = jobs.torchrun_argv(
        sp.step.argv, nnodes=count, node_rank=rank, endpoint=endpoint, rdzv_id=shared_id
    )
    node_step = dataclasses.replace(sp.step, argv=real)
    ctx = node.job_context(plan.workdir)
    run = node.classified(runtime.run)

    def execute(step: Step, ctx: Context) -> Outcome:
        return run(node_step, ctx)  # the record shows the template; this node runs it with its values

    if rank != "0":
        # Every node decides to skip from the same record, so no torchrun waits for a rendezvous alone.
        reason = jobs.skip_reason(plan.workdir, shown, runtime)
        if reason and not loaded.doc["force"]:
            say(f"train: node {rank}: skipped ({reason})")
            return 0
        outcome = execute(shown.step, ctx)
        say(f"train: node {rank}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
        return 0 if outcome.ok else 1
    entry = node.record_entry(node_count=int(count), rendezvous=endpoint)
    outcome = runner.run_stage(
        plan, shown, runtime, ctx, force=bool(loaded.doc["force"]), say=say, execute=execute, extra=entry
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


# --- merge, check and cleanup -------------------------------------------------------------------------------------


def _after_array(
    plan_file: Path, stage: str, expected: str, refusal: str, fix: str
) -> tuple[planfile.Loaded, int, StagePlan, list[dict[str, Any] | None], str | None]:
    """The job after a stage's job array (merge, check): the submitted plan, the task count, the stage, the tasks'
    outcomes and the array's id. Refused for a stage other than `expected`."""
    loaded = planfile.load(plan_file)
    job = loaded.job(stage)
    if job["kind"] != "shards" or stage != expected:
        raise UserError(refusal, field="--stage", value=stage, fix=fix)
    count = int(job["shards"])
    outcomes = shards.shard_outcomes(loaded.plan.workdir, count, stage)
    return (
        loaded,
        count,
        loaded.stage(stage),
        outcomes,
        shards.array_job(loaded.plan.workdir, stage, outcomes),
    )


def merge(plan_file: Path, stage: str, *, say: Say = say) -> int:
    """The job after a job array: account for every shard, merge their outputs, write the stage record."""
    loaded, count, sp, outcomes, array = _after_array(
        plan_file,
        stage,
        shards.STAGE,
        f"stage {stage} is not a job array merged by the kit",
        "merge --stage regen (hsextract's array is followed by check)",
    )
    plan = loaded.plan
    ctx = Context(run_dir=plan.workdir, run_id=plan.workdir.name)
    runtime = loaded.runtime
    if runtime.uses_images:
        image = next((o["image"] for o in outcomes if o and o.get("image")), None)
        runtime = runtime.with_recorded_image(image or {"reference": runtime.image_reference(sp.step.image)})
    say(f"{stage}: merging the {count} shard(s) of job array {array or '?'} here, in the kit's environment")

    def execute(step: Step, ctx: Context) -> Outcome:
        return shards.merged_outcome(plan, sp, count, here().job_id())

    def tell(text: str) -> None:  # the merge runs here, in the kit, not in the stage's image
        if not text.startswith(f"{stage}: running in "):
            say(text)

    # The merge starts no server (regen's ports may be taken on this node) and reads its input itself.
    return _record_after_array(loaded, sp, runtime, ctx, execute, array, count, tell)


def check(plan_file: Path, stage: str, *, say: Say = say) -> int:
    """The job after hsextract's job array: the tasks' outcomes, then the whole-output check (`hsextract-check`, in
    the stage's image through the runtime), the stage's summary and record."""
    loaded, count, sp, _, array = _after_array(
        plan_file, stage, shards.HSEXTRACT, f"stage {stage} has no check job", "check --stage hsextract"
    )
    plan, runtime = loaded.plan, loaded.runtime
    node = here()
    ctx = node.job_context(plan.workdir)
    say(f"{stage}: checking the output of the {count} task(s) of job array {array or '?'}")
    run = node.classified(runtime.run)

    def execute(step: Step, ctx: Context) -> Outcome:
        return shards.checked_outcome(plan, sp, runtime, count, node.job_id(), run=run, ctx=ctx)

    # The check starts no server (the stage's ports may be taken on this node).
    return _record_after_array(loaded, sp, runtime, ctx, execute, array, count, say)


def _record_after_array(loaded, sp, runtime, ctx, execute, array, count, say: Say) -> int:
    """The merge or check job's step through the stage runner (record, summary, skip), without the preconditions
    of a stage that starts servers; exit 0 when the stage completed or was already complete."""
    outcome = runner.run_stage(
        loaded.plan,
        sp,
        runtime,
        ctx,
        force=bool(loaded.doc["force"]),
        say=say,
        execute=execute,
        extra=here().record_entry(array_job_id=array, shards=count),
        preconditions=False,
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def cleanup(plan_file: Path, stage: str, *, shard: int | None = None, check: bool = False) -> int:
    """Remove the job's container at once (the job script's SIGTERM trap): cancelling the job ends the engine's
    client but not the container it started. By name, which the runtime derives from the run directory and the
    step."""
    doc = planfile.read(plan_file)
    engine = doc["runtime"]
    if engine not in ("docker", "podman"):
        return 0
    workdir = Path(doc["workdir"])
    if check:
        step = shards.check_name(stage)
    else:
        step = shards.step_name(shard, stage) if shard is not None else stage
    remove_container(engine, container_name(Context(run_dir=workdir, run_id=workdir.name), step))
    return 0
