"""Inside a Slurm job: run one stage (or one shard, or one node's part of training) through the runtime, merge
regen's shards or check hsextract's whole output after a job array, run a benchmark's supervisor
(`run_benchmark`), or remove a job's container.

A stage's job calls the runner's own `run_stage`, so the skip check, the preconditions, the outputs' validation
and the stage record are a local run's; the record gains a `slurm` entry (job id, nodes). Slurm stops a job with
SIGTERM (then SIGKILL after KillWait): the step is stopped through the runtime — its container by name, or the
local process group, killed `MARGIN_S` before KillWait runs out (`stop_grace`) — and the record says why, read
from Slurm: a time limit (`Reason=TimeLimit`) is `timed_out`, anything else (scancel, preemption) `interrupted`.
An array task writes a `running` outcome before its step starts, for the job after the array to go by if the task
is killed before it can write its end.

Exit status: 0 when the stage completed (or was already complete), 1 when not, 2 for a user error, 143 when
stopped before anything could be recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError, run_main
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.provenance import now
from draftscope.core.schema import check as check_schema
from draftscope.execute.slurm import jobs, planfile, shards, states
from draftscope.pipeline.plan import StagePlan
from draftscope.runtime import Context, Outcome, Runtime
from draftscope.runtime.step import Step

Say = Callable[[str], None]


def say(text: str) -> None:
    print(text, flush=True)


def job_id() -> str | None:
    """This job's id as squeue shows it: `12`, or `12_3` for a task of array 12."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task is not None:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def slurm_entry(**more: Any) -> dict[str, Any]:
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    entry: dict[str, Any] = {"job_id": job_id() or "none", "nodes": nodes}
    entry.update({k: v for k, v in more.items() if v is not None})
    return {"slurm": entry}


@contextlib.contextmanager
def stops_interrupt() -> Iterator[None]:
    """Slurm's SIGTERM interrupts the wait for the step (as Ctrl-C does), once: the runtime then stops the step
    and the record is written before KillWait runs out. A second SIGTERM is ignored while that happens."""

    def stopped(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


MARGIN_S = 2.0  # what the kit needs after stopping its step: ask Slurm why, write the record


def stop_grace(default: float = Context.grace_seconds) -> float:
    """How long the step may take to end after SIGTERM before the kit kills it, inside a job: short enough that
    the record is written before Slurm's own SIGKILL (KillWait after its SIGTERM, 30 s by default, often less)."""
    from draftscope.execute.slurm import client

    if not os.environ.get("SLURM_JOB_ID"):
        return default
    wait = client.kill_wait()
    return default if wait is None else max(1.0, min(default, wait - MARGIN_S))


def job_context(run_dir: Path) -> Context:
    """The runtime context of a step run inside a job (`stop_grace`)."""
    return Context(run_dir=run_dir, run_id=run_dir.name, grace_seconds=stop_grace())


def own_state() -> states.JobState | None:
    """This job's record in slurmctld (SLURM_JOB_ID is unique per array task too)."""
    from draftscope.execute.slurm import client

    ident = os.environ.get("SLURM_JOB_ID")
    if not ident:
        return None
    try:
        found = client.show(ident)
    except UserError:
        return None
    return found[0] if found else None


def explain_stop(outcome: Outcome) -> Outcome:
    """An interrupted outcome inside a Slurm job, explained by Slurm: timed out, or cancelled / preempted."""
    if outcome.status == "interrupted" and os.environ.get("SLURM_JOB_ID"):
        status, reason = states.stop_cause(own_state())
        outcome = dataclasses.replace(outcome, status=status, reason=reason)
    return outcome


def classified(run: Callable[[Step, Context], Outcome]) -> Callable[[Step, Context], Outcome]:
    """`run`, with an interrupted outcome explained by Slurm (`explain_stop`)."""

    def execute(step: Step, ctx: Context) -> Outcome:
        return explain_stop(run(step, ctx))

    return execute


# --- run-step ---------------------------------------------------------------------------------------------------


def run_step(
    plan_file: Path, stage: str, *, shard: int | None = None, rdzv_endpoint: str | None = None, say: Say = say
) -> int:
    from draftscope.pipeline import runner

    loaded = planfile.load(plan_file)
    plan, runtime = loaded.plan, loaded.runtime
    ctx = job_context(plan.workdir)
    if stage == "fetch":
        step = runner.fetch_step(plan)
        if step is None:
            say("fetch: the target snapshot is already in the hub cache")
            return 0
        outcome = classified(runtime.run)(step, ctx)
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
        plan, sp, runtime, ctx, force=force, say=say, execute=classified(runtime.run), extra=slurm_entry()
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def run_shard(loaded: planfile.Loaded, shard: int, *, stage: str = shards.STAGE, say: Say = say) -> int:
    """One task of a stage's job array (regen, hsextract): the stage's step on this shard's rows; its outcome in
    slurm/shards/<stage>/."""
    from draftscope.pipeline import runner

    plan, runtime = loaded.plan, loaded.runtime
    sp = loaded.stage(stage)
    count = int(loaded.job(stage)["shards"])
    if not 0 <= shard < count:
        raise UserError(f"{stage} has {count} shard(s)", field="--shard", value=shard)
    ctx = job_context(plan.workdir)
    workdir = plan.workdir
    reason = skip_reason(workdir, sp, runtime)
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
    # Recorded before the step starts: a task killed before it can say how it ended (SIGKILL after KillWait, a
    # lost node) leaves its job id, and the job after the array asks Slurm about it.
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
    outcome = classified(runtime.run)(sharded.step, ctx)
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
    record = {
        "shard": shard,
        "shards": count,
        "status": status,
        "reason": reason,
        "exit_code": exit_code,
        "seconds": round(seconds, 3),
        "job_id": job_id(),
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "nodes": os.environ.get("SLURM_JOB_NODELIST"),
        "image": image,
        "started_at": started_at,
        "finished_at": None if status == "running" else now(),
    }
    path = shards.outcome_path(workdir, shard, stage)
    check_schema(record, shards.OUTCOME_SCHEMA, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)


def run_torchrun(loaded: planfile.Loaded, endpoint: str | None, *, say: Say = say) -> int:
    """One node's part of training across nodes (one srun task per node). Node 0 runs the stage as a whole run
    does and writes the record; the others run the same step (their torchrun joins the rendezvous)."""
    from draftscope.pipeline import runner

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
    rank = os.environ.get("SLURM_NODEID", "0")
    real = jobs.torchrun_argv(
        sp.step.argv,
        nnodes=os.environ.get("SLURM_NNODES", "1"),
        node_rank=rank,
        endpoint=endpoint,
        rdzv_id=os.environ.get("SLURM_JOB_ID", "draftscope"),
    )
    node_step = dataclasses.replace(sp.step, argv=real)
    ctx = job_context(plan.workdir)
    run = classified(runtime.run)

    def execute(step: Step, ctx: Context) -> Outcome:
        return run(node_step, ctx)  # the record shows the template; this node runs it with its values

    if rank != "0":
        # Every node decides to skip from the same record, so no torchrun waits for a rendezvous alone.
        reason = skip_reason(plan.workdir, shown, runtime)
        if reason and not loaded.doc["force"]:
            say(f"train: node {rank}: skipped ({reason})")
            return 0
        outcome = execute(shown.step, ctx)
        say(f"train: node {rank}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
        return 0 if outcome.ok else 1
    entry = slurm_entry(node_count=int(os.environ.get("SLURM_NNODES", "1")), rendezvous=endpoint)
    outcome = runner.run_stage(
        plan, shown, runtime, ctx, force=bool(loaded.doc["force"]), say=say, execute=execute, extra=entry
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def skip_reason(workdir: Path, sp: StagePlan, runtime: Runtime) -> str | None:
    """Why the stage's record lets it be skipped, computed as `runner.run_stage` does (argv, commands, image
    reference, inputs, outputs), without asking the container engine: the host that submits may have none."""
    from draftscope.pipeline import state

    ctx = Context(run_dir=workdir, run_id=workdir.name)
    reference = runtime.image_reference(sp.step.image)
    config_hash = state.config_sha256(
        runtime.argv(sp.step, ctx), [c.to_dict() for c in sp.commands], reference
    )
    return state.skip_reason(
        state.read_record(workdir, sp.stage.name),
        config_hash=config_hash,
        inputs=state.fingerprints(sp.inputs),
        outputs=sp.outputs,
    )


# --- a benchmark ------------------------------------------------------------------------------------------------


def run_benchmark(job_file: Path, *, say: Say = say) -> int:
    """The benchmark's supervisor, as a local run's, with the submitted config (`slurm.benchmark`); a stop by Slurm
    (scancel, the time limit) is recorded as Slurm explains it. Exit 0 only for a completed run."""
    from draftscope.bench.supervisor import run_benchmark as supervise
    from draftscope.execute.slurm.benchmark import load

    loaded = load(job_file)
    nodes = os.environ.get("SLURM_JOB_NODELIST") or socket.gethostname()
    note = (
        f"supervised in Slurm job {job_id() or 'none'} on {nodes} (invoke benchmark --executor slurm, "
        f"submitted from {loaded.doc.get('host')})"
    )
    manifest = supervise(
        loaded.config,
        loaded.output,
        argv=list(loaded.doc["argv"]),
        say=say,
        notes=[note],
        explain=explain_stop,
        grace_seconds=stop_grace(),
    )
    reason = manifest.get("reason")
    say(f"{loaded.output}: {manifest['status']}" + (f" ({reason})" if reason else ""))
    return 0 if manifest["status"] == "completed" else 1


def cleanup_benchmark(job_file: Path) -> int:
    """Remove the benchmark's containers at once (the job script's SIGTERM trap), by the names the runtime gives
    them: `scancel` ends the engine's client, not its container."""
    from draftscope.runtime.base import container_name

    try:
        doc = read_json(job_file)
    except Exception:
        return 0  # nothing to go by; the supervisor stops its own container too
    engine, output = doc.get("runtime"), Path(doc.get("output") or ".")
    ctx = Context(run_dir=output, run_id=output.name)
    for step in doc.get("steps") or ():
        _remove_container(engine, container_name(ctx, step["name"]))
    return 0


# --- merge and cleanup --------------------------------------------------------------------------------------------


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
    from draftscope.pipeline import runner

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
        return shards.merged_outcome(plan, sp, count, job_id())

    def tell(text: str) -> None:  # the merge runs here, in the kit, not in the stage's image
        if not text.startswith(f"{stage}: running in "):
            say(text)

    # No preconditions: the merge starts no server (regen's ports may be taken on this node) and reads its input
    # itself.
    outcome = runner.run_stage(
        plan,
        sp,
        runtime,
        ctx,
        force=bool(loaded.doc["force"]),
        say=tell,
        execute=execute,
        extra=slurm_entry(array_job_id=array, shards=count),
        preconditions=False,
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def check(plan_file: Path, stage: str, *, say: Say = say) -> int:
    """The job after hsextract's job array: the tasks' outcomes, then the whole-output check (`hsextract-check`, in
    the stage's image through the runtime), the stage's summary and record."""
    from draftscope.pipeline import runner

    loaded, count, sp, _, array = _after_array(
        plan_file, stage, shards.HSEXTRACT, f"stage {stage} has no check job", "check --stage hsextract"
    )
    plan, runtime = loaded.plan, loaded.runtime
    ctx = job_context(plan.workdir)
    say(f"{stage}: checking the output of the {count} task(s) of job array {array or '?'}")
    run = classified(runtime.run)

    def execute(step: Step, ctx: Context) -> Outcome:
        return shards.checked_outcome(plan, sp, runtime, count, job_id(), run=run, ctx=ctx)

    # No preconditions: the check starts no server (the stage's ports may be taken on this node).
    outcome = runner.run_stage(
        plan,
        sp,
        runtime,
        ctx,
        force=bool(loaded.doc["force"]),
        say=say,
        execute=execute,
        extra=slurm_entry(array_job_id=array, shards=count),
        preconditions=False,
    )
    return 0 if outcome.status in ("completed", "skipped") else 1


def cleanup(plan_file: Path, stage: str, *, shard: int | None = None, check: bool = False) -> int:
    """Remove the job's container at once (the job script's SIGTERM trap): `scancel` ends the engine's client but
    not the container it started. By name, which the runtime derives from the run directory and the step."""
    from draftscope.runtime.base import container_name

    doc = planfile.read(plan_file)
    engine = doc["runtime"]
    if engine not in ("docker", "podman"):
        return 0
    workdir = Path(doc["workdir"])
    if check:
        step = shards.check_name(stage)
    else:
        step = shards.step_name(shard, stage) if shard is not None else stage
    _remove_container(engine, container_name(Context(run_dir=workdir, run_id=workdir.name), step))
    return 0


def _remove_container(engine: str | None, name: str) -> None:
    if engine not in ("docker", "podman"):
        return
    # No grace: Slurm's SIGKILL follows within KillWait; --init has already passed SIGTERM to the step.
    extra = ["--time", "0"] if engine == "podman" else []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([engine, "rm", "--force", *extra, name], capture_output=True, timeout=30, check=False)


def main_guard(fn: Callable[[], int]) -> int:
    """Run a node command under Slurm's SIGTERM handling: user errors as one line (exit 2, `run_main`), a stop
    before anything could be recorded as 143."""
    try:
        with stops_interrupt():
            return run_main(fn)
    except KeyboardInterrupt:
        print("stopped (SIGTERM) before the step could be recorded", file=sys.stderr, flush=True)
        return 143
