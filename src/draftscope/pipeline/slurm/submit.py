"""`invoke pipeline --executor slurm`, host side: a pipeline plan's stages as a chain of jobs, handed to the Slurm
executor (`execute.slurm.executor`), and the stages' outcomes read back from their records.

1. Everything that can be refused is refused before any file or job exists: the runner's preflight (inputs,
   pinned target, stages with no runner on the device) — the images and GPUs are checked by each job on its node,
   since the submitting host (a login node) may have neither — and `sbatch --test-only` of every job script
   (partition, account, QOS, resources).
2. Stages whose record says they completed with the same command and inputs are not submitted; from the first
   stage that is not complete on, every selected stage is (each job still skips itself if its record is
   complete when it starts, as a local run does).
3. Submission: each job after the previous stage's (`afterok`; the job after a job array, regen's merge or
   hsextract's check, with `afterany`); a failed stage cancels the rest of the chain. `slurm/jobs.json` keeps
   every submission's job ids, states and log files.
4. Following: state changes are printed every `slurm.poll_interval_s`; Ctrl-C cancels every submitted job that has
   not ended and waits for them to end.
5. Outcomes, per stage: the stage record the job wrote (it names the job), else Slurm's final state mapped onto
   the run's statuses (TIMEOUT → timed_out, CANCELLED → interrupted, FAILED / NODE_FAIL / OUT_OF_MEMORY →
   failed, with the reason), as the local runner reports them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from draftscope.execute.slurm import client, executor
from draftscope.execute.slurm.executor import Printer
from draftscope.execute.slurm.ledger import Ledger, Submitted
from draftscope.execute.slurm.states import worst
from draftscope.pipeline import plan as planning
from draftscope.pipeline import runner, state
from draftscope.pipeline.plan import PipelinePlan
from draftscope.pipeline.runner import StageOutcome
from draftscope.pipeline.slurm import jobs, layout, planfile, shards
from draftscope.runtime import LocalRuntime, Runtime
from draftscope.runtime.base import tail

# --- before submitting -------------------------------------------------------------------------------------------


def complete_prefix(plan: PipelinePlan, runtime: Runtime, force: bool) -> tuple[list[tuple[str, str]], int]:
    """The leading stages whose records let them be skipped, and the index of the first one to submit."""
    skipped: list[tuple[str, str]] = []
    if force:
        return skipped, 0
    for i, sp in enumerate(plan.stages):
        shown, rt = jobs.record_step(sp, runtime, plan.config)
        reason = jobs.skip_reason(plan.workdir, shown, rt)
        if reason is None:
            return skipped, i
        skipped.append((sp.stage.name, reason))
    return skipped, len(plan.stages)


def prepare(jp: jobs.JobPlan, *, force: bool) -> None:
    """The files the jobs read: plan.json, the job scripts, the logs folder. A job array's stale shard outcomes
    are removed, so the merge or check job reads only this submission's."""
    planfile.write(jp, force=force)
    executor.write_scripts(jp)
    for job in jp.jobs:
        if job.kind == "shards":
            for old in shards.outcomes_dir(jp.plan.workdir, job.stage).glob("*.json"):
                old.unlink()


# --- outcomes ------------------------------------------------------------------------------------------------------


def stage_outcomes(plan: PipelinePlan, submitted: Sequence[Submitted]) -> list[StageOutcome]:
    """Per stage, in order, up to the first that did not complete: its record if this submission's job wrote it,
    else Slurm's account of its jobs."""
    outcomes: list[StageOutcome] = []
    stages = list(dict.fromkeys(s.job.stage for s in submitted))
    for stage in stages:
        group = [s for s in submitted if s.job.stage == stage]
        last = group[-1]
        record = state.read_record(plan.workdir, stage) if stage != "fetch" else None
        writer = ((record or {}).get("slurm") or {}).get("job_id")
        if record is not None and writer == last.job_id:
            outcome = StageOutcome(stage, record["status"], record["reason"], float(record["seconds"]))
        elif all(s.status == "completed" for s in group):
            if stage == "fetch":
                outcome = StageOutcome(stage, "completed")
            elif record is not None and record["status"] == "completed":
                who = f"job {writer}" if writer else "a local run"
                outcome = StageOutcome(
                    stage, "skipped", f"completed earlier ({who}) with the same inputs and command"
                )
            else:
                outcome = StageOutcome(
                    stage, "failed", f"job {last.job_id} ended without a completion record; see {last.log}"
                )
        else:
            status = worst(s.status or "interrupted" for s in group)
            first = next(s for s in group if (s.status or "interrupted") == status)
            reason = first.reason or status
            detail = tail(first.log, lines=1) if status == "failed" and first.job.kind != "shards" else ""
            outcome = StageOutcome(stage, status, reason + (f": {detail}" if detail else ""))
        outcomes.append(outcome)
        if outcome.status not in ("completed", "skipped"):
            break
    return outcomes


# --- the whole run ---------------------------------------------------------------------------------------------------


def run(
    plan: PipelinePlan,
    runtime: Runtime,
    *,
    force: bool = False,
    argv: list[str] | None = None,
    say: Printer = print,
) -> list[StageOutcome]:
    client.require("sbatch")
    # A LocalRuntime, no GPU check: the images and GPUs are on the nodes, not on the submitting host (the
    # module docstring); the jobs check them there.
    runner.preflight(plan, LocalRuntime(), check_gpus=False)
    ledger = Ledger(plan.workdir, layout.ledger_path(plan.workdir))
    ledger.refuse_active()
    skipped, start = complete_prefix(plan, runtime, force)
    for stage, why in skipped:
        say(f"{stage}: skipped ({why})")
    outcomes = [StageOutcome(stage, "skipped", why) for stage, why in skipped]
    if start == len(plan.stages):
        return outcomes
    jp = jobs.build(
        plan, runtime, python=sys.executable, start=start, fetch=runner.fetch_step(plan) is not None
    )
    executor.validate(jp)
    runner.write_frozen_config(plan, argv if argv is not None else sys.argv)
    prepare(jp, force=force)
    submitted = executor.submit_all(jp)
    ledger.add(submitted, argv if argv is not None else sys.argv, runtime=jp.runtime, python=jp.python)
    listed = ", ".join(
        f"{s.job.key} {s.job_id}" + (f" (array {s.job.array})" if s.job.array else "") for s in submitted
    )
    say(
        f"slurm: submitted {len(submitted)} job(s): {listed}; output in {plan.workdir / layout.LOGS_DIR}/slurm-*.out"
    )
    executor.follow(
        submitted,
        ledger,
        poll=plan.config.slurm.poll_interval_s,
        say=say,
        resume=f"resubmitting later submits only what is not complete ({ledger.path})",
    )
    outcomes += stage_outcomes(plan, submitted)
    for o in outcomes[len(skipped) :]:
        if o.status in ("completed", "skipped"):  # the caller reports the one that did not complete
            say(f"{o.stage}: {o.status}" + (f" ({o.reason})" if o.reason else "") + f" in {o.seconds:.1f} s")
    return outcomes


def dry_run_lines(plan: PipelinePlan, runtime: Runtime) -> list[str]:
    """Every job script and sbatch line of a submission of the whole selection (a real run leaves out the
    stages already complete). Pure: no file, no Slurm command."""
    needed = runner.fetch_step(plan) is not None
    jp = jobs.build(plan, runtime, python=sys.executable, fetch=needed)
    planned = planning.fetch_step(plan) is not None
    skipped = [("fetch", "the pinned target snapshot is in the hub cache")] if planned and not needed else []
    return jobs.dry_run_lines(jp, skipped)
