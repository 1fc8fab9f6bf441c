"""`invoke pipeline --executor slurm`, host side: the pipeline's part of a batch submission (`PipelineWork`, an
`execute.base.Batch`), handed to the launcher, which checks, submits and follows the jobs (`execute.slurm`).

1. Everything that can be refused is refused before any file or job exists: the runner's preflight (inputs,
   pinned target, stages with no runner on the device) — the images and GPUs are checked by each job on its node,
   since the submitting host (a login node) may have neither — and the launcher's check of every job
   (partition, account, QOS, resources).
2. Stages whose record says they completed with the same command and inputs are not submitted; from the first
   stage that is not complete on, every selected stage is (each job still skips itself if its record is
   complete when it starts, as a local run does).
3. Submission: each job after the previous stage's (the job after a job array, regen's merge or hsextract's
   check, however the array ended); a failed stage cancels the rest of the chain. `slurm/jobs.json` keeps every
   submission's job ids, states and log files.
4. Following: state changes are printed every `slurm.poll_interval_s`; Ctrl-C cancels every submitted job that has
   not ended and waits for them to end.
5. Outcomes, per stage (`execute.outcomes.in_order`, as the local runner's): the stage record the job wrote (it
   names the job), else the scheduler's final state mapped onto the run's statuses (a time limit → timed_out,
   cancelled → interrupted, failed / lost node / out of memory → failed, with the reason).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.execute import registry
from draftscope.execute.base import Ended, JobNode, Printer
from draftscope.execute.injob import here
from draftscope.execute.outcomes import StageOutcome, in_order, worst
from draftscope.execute.plan import JobChain
from draftscope.pipeline import plan as planning
from draftscope.pipeline import runner, state
from draftscope.pipeline.batch import jobs, layout, planfile, shards
from draftscope.pipeline.plan import PipelinePlan
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


# --- outcomes ------------------------------------------------------------------------------------------------------


def stage_outcomes(
    plan: PipelinePlan, submitted: Sequence[Ended], node: JobNode | None = None
) -> list[StageOutcome]:
    """Per stage, in order, up to the first that did not complete: its record if this submission's job wrote it,
    else the scheduler's account of its jobs."""
    key = (node or here()).name  # the record's entry about the job that wrote it

    def outcome(stage: str) -> StageOutcome:
        group = [s for s in submitted if s.job.stage == stage]
        last = group[-1]
        record = state.read_record(plan.workdir, stage) if stage != "fetch" else None
        writer = ((record or {}).get(key) or {}).get("job_id")
        if record is not None and writer == last.job_id:
            return StageOutcome(stage, record["status"], record["reason"], float(record["seconds"]))
        if all(s.status == "completed" for s in group):
            if stage == "fetch":
                return StageOutcome(stage, "completed")
            if record is not None and record["status"] == "completed":
                who = f"job {writer}" if writer else "a local run"
                return StageOutcome(
                    stage, "skipped", f"completed earlier ({who}) with the same inputs and command"
                )
            return StageOutcome(
                stage, "failed", f"job {last.job_id} ended without a completion record; see {last.log}"
            )
        status = worst(s.status or "interrupted" for s in group)
        first = next(s for s in group if (s.status or "interrupted") == status)
        reason = first.reason or status
        detail = tail(first.log, lines=1) if status == "failed" and first.job.kind != "shards" else ""
        return StageOutcome(stage, status, reason + (f": {detail}" if detail else ""))

    return in_order(dict.fromkeys(s.job.stage for s in submitted), outcome)


# --- the pipeline's part of a submission ---------------------------------------------------------------------------


@dataclass
class PipelineWork:
    """A pipeline plan for a launcher: run here (`run_here`), or as batch jobs (the `execute.base.Batch` hooks)."""

    plan: PipelinePlan
    runtime: Runtime
    force: bool = False
    node: JobNode = field(
        default_factory=here
    )  # the batch launcher's jobs: names, placeholders, record entry
    skipped: list[StageOutcome] = field(default_factory=list)  # the stages a submission leaves out

    # the local launcher

    def run_here(self, *, argv: list[str], say: Printer) -> list[StageOutcome]:
        return runner.run_pipeline(self.plan, self.runtime, force=self.force, argv=argv, say=say)

    def dry_run_here(self) -> list[str]:
        return planning.dry_run_lines(self.plan, self.runtime)

    # a batch launcher

    @property
    def folder(self) -> Path:
        return self.plan.workdir

    @property
    def ledger(self) -> Path:
        return layout.ledger_path(self.plan.workdir)

    @property
    def resume(self) -> str:
        return f"resubmitting later submits only what is not complete ({self.ledger})"

    order = jobs.ORDER

    def preflight(self) -> None:
        # A LocalRuntime, no GPU check: the images and GPUs are on the nodes, not on the submitting host (the
        # module docstring); the jobs check them there.
        runner.preflight(self.plan, LocalRuntime(), check_gpus=False)

    def jobs(self, say: Printer) -> JobChain | None:
        plan = self.plan
        skipped, start = complete_prefix(plan, self.runtime, self.force)
        for stage, why in skipped:
            say(f"{stage}: skipped ({why})")
        self.skipped = [StageOutcome(stage, "skipped", why) for stage, why in skipped]
        if start == len(plan.stages):
            return None
        fetch = runner.fetch_step(plan) is not None
        return jobs.build(plan, self.runtime, python=sys.executable, start=start, fetch=fetch)

    def dry_run(self, executor: str) -> tuple[list[str], JobChain]:
        """Every job of a submission of the whole selection (a real run leaves out the stages already complete)."""
        plan = self.plan
        needed = runner.fetch_step(plan) is not None
        jp = jobs.build(plan, self.runtime, python=sys.executable, fetch=needed)
        planned = planning.fetch_step(plan) is not None
        skipped = (
            [("fetch", "the pinned target snapshot is in the hub cache")] if planned and not needed else []
        )
        return jobs.heading(jp, skipped, executor), jp

    def write(self, chain: JobChain, argv: list[str]) -> None:
        """The frozen config, plan.json; a job array's stale shard outcomes are removed, so the merge or check job
        reads only this submission's."""
        assert isinstance(chain, jobs.JobPlan)
        runner.write_frozen_config(self.plan, argv)
        planfile.write(chain, force=self.force)
        for job in chain.jobs:
            if job.kind == "shards":
                for old in shards.outcomes_dir(self.plan.workdir, job.stage).glob("*.json"):
                    old.unlink()

    def discard(self) -> None:
        return None  # the workdir accumulates: what was written stays, and the next submission rewrites it

    def announce(self, submitted: Sequence[Ended]) -> str:
        listed = ", ".join(
            f"{s.job.key} {s.job_id}" + (f" (array {s.job.array})" if s.job.array else "") for s in submitted
        )
        logs = self.plan.workdir / layout.LOGS_DIR
        return f"{self.node.name}: submitted {len(submitted)} job(s): {listed}; output in {logs}/slurm-*.out"

    def poll(self) -> float:
        return self.plan.config.slurm.poll_interval_s

    def following(self, say: Printer) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def outcome(self, submitted: Sequence[Ended], say: Printer) -> list[StageOutcome]:
        ran = stage_outcomes(self.plan, submitted, self.node)
        for o in ran:
            if o.done:  # the caller reports the one that did not complete
                say(
                    f"{o.stage}: {o.status}"
                    + (f" ({o.reason})" if o.reason else "")
                    + f" in {o.seconds:.1f} s"
                )
        return self.skipped + ran


# --- what the command line calls -----------------------------------------------------------------------------------


def run(
    plan: PipelinePlan, runtime: Runtime, *, argv: list[str] | None = None, **work: Any
) -> list[StageOutcome]:
    """The pipeline as the Slurm launcher's batch jobs: its outcomes per stage. `work`: `PipelineWork`'s options."""
    launcher = registry.get("slurm")
    return launcher.launch(
        PipelineWork(plan, runtime, **work), argv=argv if argv is not None else sys.argv, say=print
    )


def dry_run_lines(plan: PipelinePlan, runtime: Runtime, executor: str = "slurm") -> list[str]:
    """What a launch would write and run (for a batch launcher, every job and submission line of the whole
    selection; a real run leaves out the stages already complete). Pure: no file, no scheduler command."""
    return registry.get(executor).dry_run_lines(PipelineWork(plan, runtime))
