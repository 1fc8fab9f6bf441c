"""The Slurm executor, host side: submit a pipeline plan's stages as jobs, follow them, cancel them on Ctrl-C.

1. Everything that can be refused is refused before any file or job exists: the runner's preflight (inputs,
   pinned target, stages with no runner on the device) — the images and GPUs are checked by each job on its node,
   since the submitting host (a login node) may have neither — and `sbatch --test-only` of every job script
   (partition, account, QOS, resources).
2. Stages whose record says they completed with the same command and inputs are not submitted; from the first
   stage that is not complete on, every selected stage is (each job still skips itself if its record is
   complete when it starts, as a local run does).
3. Submission: `sbatch --parsable`, each job after the previous stage's (`afterok`; the job after a job array,
   regen's merge or hsextract's check, with `afterany`); `--kill-on-invalid-dep=yes` cancels the rest of the chain
   when a stage fails.
   `slurm/jobs.json` keeps every submission's job ids, states and log files.
4. Following: `scontrol show job -o` per job every `slurm.poll_interval_s`; state changes are printed. Ctrl-C
   cancels every submitted job that has not ended (`scancel`) and waits for them to end.
5. Outcomes, per stage: the stage record the job wrote (it names the job), else Slurm's final state mapped onto
   the run's statuses (TIMEOUT → timed_out, CANCELLED → interrupted, FAILED / NODE_FAIL / OUT_OF_MEMORY →
   failed, with the reason), as the local runner reports them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.provenance import command_line, now
from draftscope.core.schema import check
from draftscope.execute.slurm import client, jobs, planfile
from draftscope.execute.slurm.states import JobState, summarize, worst
from draftscope.pipeline import state
from draftscope.pipeline.plan import PipelinePlan
from draftscope.pipeline.runner import StageOutcome
from draftscope.runtime import Runtime
from draftscope.runtime.base import tail

Printer = Callable[[str], None]
CANCEL_WAIT_S = 120.0
UNREACHABLE_S = 300.0  # how long the executor keeps asking a controller that does not answer
LEDGER_VERSION = 1
LEDGER_SCHEMA = "slurm-jobs"


@dataclass
class Submitted:
    job: jobs.Job
    job_id: str
    dependency: str | None
    log: Path
    records: list[JobState] = field(default_factory=list)
    status: str | None = None  # the run status once the job (every task) has ended
    reason: str | None = None
    shown: dict[str, str] = field(default_factory=dict)  # what was last printed per task

    @property
    def final(self) -> bool:
        return self.status is not None

    def to_dict(self, workdir: Path) -> dict[str, Any]:
        return {
            "key": self.job.key,
            "stage": self.job.stage,
            "kind": self.job.kind,
            "job_id": self.job_id,
            "array": self.job.array,
            "dependency": self.dependency,
            "log": str(self.log.relative_to(workdir)),
            "status": self.status,
            "reason": self.reason,
            "tasks": [
                {
                    "job_id": r.job_id,
                    "state": r.state,
                    "reason": r.reason,
                    "exit_code": r.exit_code,
                    "nodes": r.nodes,
                }
                for r in self.records
            ],
        }


class Ledger:
    """`slurm/jobs.json`: every submission to this workdir, its jobs, their ids, states and logs (a benchmark's:
    `<run>.slurm/jobs.json`, its `path`). Log paths are kept relative to `workdir`."""

    def __init__(self, workdir: Path, path: Path | None = None) -> None:
        self.workdir = workdir
        self.path = path or workdir / jobs.SLURM_DIR / jobs.JOBS_FILE
        self.data: dict[str, Any] = {"schema_version": LEDGER_VERSION, "submissions": []}
        if self.path.is_file():
            try:
                loaded = read_json(self.path)
            except Exception:
                loaded = None
            if isinstance(loaded, dict) and isinstance(loaded.get("submissions"), list):
                self.data = loaded

    def refuse_active(self) -> None:
        """An earlier submission's jobs that Slurm still runs or queues: a second chain would race it."""
        if not self.data["submissions"]:
            return
        active = []
        for entry in self.data["submissions"][-1]["jobs"]:
            if entry.get("status") is not None:
                continue
            found = client.show(entry["job_id"])
            if found and not all(r.terminal for r in found):
                active.append(entry["job_id"])
        if active:
            raise UserError(
                f"job(s) {', '.join(active)} of an earlier submission to this workdir are still queued or running",
                field="--workdir",
                value=str(self.workdir),
                fix=f"wait for them (squeue -j {','.join(active)}), or cancel them (scancel {' '.join(active)})",
            )

    def add(self, submitted: Sequence[Submitted], argv: list[str], *, runtime: str, python: str) -> None:
        self.data["submissions"].append(
            {
                "submitted_at": now(),
                "command_line": command_line(argv),
                "runtime": runtime,
                "python": python,
                "jobs": [],
            }
        )
        self.save(submitted)

    def save(self, submitted: Sequence[Submitted]) -> None:
        self.data["submissions"][-1]["jobs"] = [s.to_dict(self.workdir) for s in submitted]
        check(self.data, LEDGER_SCHEMA, str(self.path))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, self.data)


# --- before submitting -------------------------------------------------------------------------------------------


def complete_prefix(plan: PipelinePlan, runtime: Runtime, force: bool) -> tuple[list[tuple[str, str]], int]:
    """The leading stages whose records let them be skipped, and the index of the first one to submit."""
    from draftscope.execute.slurm.node import skip_reason

    skipped: list[tuple[str, str]] = []
    if force:
        return skipped, 0
    for i, sp in enumerate(plan.stages):
        shown, rt = jobs.record_step(sp, runtime, plan.config)
        reason = skip_reason(plan.workdir, shown, rt)
        if reason is None:
            return skipped, i
        skipped.append((sp.stage.name, reason))
    return skipped, len(plan.stages)


def prepare(jp: jobs.JobPlan, *, force: bool) -> None:
    """The files the jobs read: plan.json, the job scripts, the logs folder (Slurm does not create it: a job
    whose output folder is missing fails without a word). A job array's stale shard outcomes are removed, so
    the merge or check job reads only this submission's."""
    planfile.write(jp, force=force)
    (jp.plan.workdir / jobs.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    for job in jp.jobs:
        path = jp.script(job)
        path.write_text(jobs.render(jp, job), encoding="utf-8")
        path.chmod(0o755)
        if job.kind == "shards":
            for old in (jp.plan.workdir / jobs.SLURM_DIR / "shards" / job.stage).glob("*.json"):
                old.unlink()


def validate(jp: jobs.JobPlan) -> None:
    """`sbatch --test-only` of every job script, before anything is written or submitted."""
    for job in jp.jobs:
        r = job.resources
        client.test_only(
            jobs.render(jp, job), job=job.key, partition=r.partition, account=r.account, qos=r.qos
        )


def submit_all(jp: jobs.JobPlan) -> list[Submitted]:
    """Submit in order. If Slurm refuses one midway, the jobs already submitted are cancelled: a chain is
    submitted whole or not at all."""
    res = {j.key: j.resources for j in jp.jobs}
    ids: dict[str, str] = {}
    submitted: list[Submitted] = []
    try:
        for job in jp.jobs:
            r = res[job.key]
            dep = jobs.dependency(job, ids)
            ids[job.key] = client.submit(
                jp.script(job),
                dependency=dep,
                job=job.key,
                partition=r.partition,
                account=r.account,
                qos=r.qos,
            )
            log = Path(str(jp.log(job)).replace("%A", ids[job.key]).replace("%j", ids[job.key]))
            submitted.append(Submitted(job, ids[job.key], dep, log))
    except BaseException:
        client.cancel([s.job_id for s in submitted])
        raise
    return submitted


# --- following ---------------------------------------------------------------------------------------------------


def describe(record: JobState) -> str:
    if record.status and record.status != "completed":
        return record.explain()
    text = f"job {record.job_id} {record.state}"
    if record.state == "PENDING" and record.reason and record.reason != "None":
        text += f" ({record.reason})"
    elif record.state == "RUNNING" and record.nodes:
        text += f" on {record.nodes}"
    return text


def update(s: Submitted, say: Printer) -> bool:
    """Read the job's state from Slurm; print what changed; True when something did."""
    found = client.show(s.job_id)
    if found is None:  # purged (MinJobAge) before it was seen to end: its record, if any, tells the rest
        s.status, s.reason = "failed", f"Slurm no longer knows job {s.job_id}; see {s.log}"
        return True
    changed = False
    s.records = found
    for record in found:
        if record.state == "COMPLETING":
            continue  # transient: the end state follows within KillWait
        text = describe(record)
        if s.shown.get(record.job_id) != text:
            s.shown[record.job_id] = text
            say(f"{s.job.key}: {text}")
            changed = True
    if any(r.dead for r in found):
        # It can never start; Slurm usually cancels such a job itself (--kill-on-invalid-dep).
        client.cancel([s.job_id])
    if found and all(r.terminal or r.dead for r in found):
        s.status, s.reason = summarize(found)
        changed = True
    return changed


TICK_S = 0.5  # how often a callable `poll` is asked again while waiting


def follow(
    submitted: Sequence[Submitted],
    ledger: Ledger,
    *,
    poll: float | Callable[[], float],
    say: Printer,
    resume: str | None = None,
) -> None:
    """Ask Slurm about the jobs every `poll` seconds until all have ended; Ctrl-C (KeyboardInterrupt, and so the
    SIGTERM a caller turns into one) cancels those still queued or running and waits for them to end. `poll` may
    be a function, asked every half second while waiting: a caller that sees its job finish sooner (a benchmark's
    final status) shortens the wait. `resume`: what the user may do when Slurm stops answering."""
    failures = 0
    resume = resume or f"resubmitting later submits only what is not complete ({ledger.path})"
    try:
        while True:
            changed = False
            try:
                for s in submitted:
                    if not s.final:
                        changed |= update(s, say)
                failures = 0
            except UserError as exc:  # slurmctld busy or restarting: the jobs go on; ask again
                failures += 1
                every = poll() if callable(poll) else poll
                if failures == 1:
                    say(f"slurm: {exc.render()}; asking again every {every:g} s")
                if failures * every > UNREACHABLE_S:
                    raise UserError(
                        f"Slurm did not answer for {UNREACHABLE_S:g} s; the jobs were left as they are",
                        field="--executor",
                        value="slurm",
                        fix=f"follow them with squeue; {resume}",
                    ) from None
            if changed:
                ledger.save(submitted)
            if all(s.final for s in submitted):
                return
            pause(poll)
    except KeyboardInterrupt:
        active = [s.job_id for s in submitted if not s.final]
        say(f"interrupted: cancelling job(s) {' '.join(active)} (scancel) and waiting for them to end")
        client.cancel(active)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not all(s.final for s in submitted) and time.monotonic() < deadline:
            time.sleep(TICK_S if callable(poll) else min(poll, TICK_S))
            for s in submitted:
                if not s.final:
                    update(s, say)
        for s in submitted:
            if not s.final:
                s.status, s.reason = (
                    "interrupted",
                    f"job {s.job_id} was cancelled and had not ended after {CANCEL_WAIT_S:g} s",
                )
        ledger.save(submitted)


def pause(poll: float | Callable[[], float]) -> None:
    """Sleep `poll` seconds; a callable `poll` is asked again every TICK_S, and the wait ends once it has lasted
    as long as the latest answer."""
    if not callable(poll):
        time.sleep(poll)
        return
    started = time.monotonic()
    while (left := poll() - (time.monotonic() - started)) > 0:
        time.sleep(min(left, TICK_S))


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
    from draftscope.pipeline import runner
    from draftscope.runtime import LocalRuntime

    client.require("sbatch")
    # A LocalRuntime, no GPU check: the images and GPUs are on the nodes, not on the submitting host (the
    # module docstring); the jobs check them there.
    runner.preflight(plan, LocalRuntime(), check_gpus=False)
    ledger = Ledger(plan.workdir)
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
    validate(jp)
    runner.write_frozen_config(plan, argv if argv is not None else sys.argv)
    prepare(jp, force=force)
    submitted = submit_all(jp)
    ledger.add(submitted, argv if argv is not None else sys.argv, runtime=jp.runtime, python=jp.python)
    listed = ", ".join(
        f"{s.job.key} {s.job_id}" + (f" (array {s.job.array})" if s.job.array else "") for s in submitted
    )
    say(
        f"slurm: submitted {len(submitted)} job(s): {listed}; output in {plan.workdir / jobs.LOGS_DIR}/slurm-*.out"
    )
    follow(submitted, ledger, poll=plan.config.slurm.poll_interval_s, say=say)
    outcomes += stage_outcomes(plan, submitted)
    for o in outcomes[len(skipped) :]:
        if o.status in ("completed", "skipped"):  # the caller reports the one that did not complete
            say(f"{o.stage}: {o.status}" + (f" ({o.reason})" if o.reason else "") + f" in {o.seconds:.1f} s")
    return outcomes


def dry_run_lines(plan: PipelinePlan, runtime: Runtime) -> list[str]:
    """Every job script and sbatch line of a submission of the whole selection (a real run leaves out the
    stages already complete). Pure: no file, no Slurm command."""
    from draftscope.pipeline import runner

    jp = jobs.build(plan, runtime, python=sys.executable, fetch=runner.fetch_step(plan) is not None)
    return jobs.dry_run_lines(jp)
