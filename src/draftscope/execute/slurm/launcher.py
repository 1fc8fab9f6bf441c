"""The Slurm launcher: a planner's work (`execute.base.Batch`) as a chain of batch jobs, checked, written, submitted,
followed, and cancelled on Ctrl-C or SIGTERM. The planner builds the chain (`execute.plan`) and reads the outcomes
it cares about; nothing here knows what a job runs.

`launch` runs a submission in this order (the planner's hooks in brackets):
1. `ready`: Slurm's client commands are here; [preflight]; the ledger refuses to race an earlier submission's
   jobs still queued or running; [jobs].
2. `validate`: `sbatch --test-only` of every job script (partition, account, QOS, resources), before anything is
   written or submitted.
3. [write]; `write_scripts`: the job scripts, and the folders of their logs (Slurm does not create them: a job
   whose output folder is missing fails without a word).
4. `submit_all`: `sbatch --parsable`, each job after the ones it waits for (`afterok`, or `afterany` for a job that
   runs however they ended); `--kill-on-invalid-dep=yes` cancels the rest of the chain when a job fails. A chain is
   submitted whole or not at all ([discard] when it is not).
5. The ledger keeps the submission; [announce]; `follow` ([following] around it): `scontrol show job -o` per job
   every `poll` seconds; state changes are printed and kept in the ledger. Ctrl-C or SIGTERM cancels every
   submitted job that has not ended (`scancel`) and waits for them to end. Slurm's end states map onto the run's
   statuses (`states`); [outcome].

`dry_run_lines` prints what a submission writes and runs (`script`), and runs no Slurm command.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.execute.base import POLL_INTERVAL_S, Batch, Printer
from draftscope.execute.plan import Job, JobChain
from draftscope.execute.slurm import client, node, script
from draftscope.execute.slurm.ledger import Ledger, Submitted
from draftscope.execute.slurm.states import JobState, summarize
from draftscope.runtime.base import sigterm_interrupts

__all__ = ["POLL_INTERVAL_S", "SlurmLauncher"]
CANCEL_WAIT_S = 120.0
UNREACHABLE_S = 300.0  # how long the launcher keeps asking a controller that does not answer
TICK_S = 0.5  # how often a callable `poll` is asked again while waiting


# --- before submitting -------------------------------------------------------------------------------------------


def validate(chain: JobChain) -> None:
    """`sbatch --test-only` of every job script, before anything is written or submitted."""
    for job in chain.jobs:
        r = job.resources
        client.test_only(
            script.render(chain, job),
            job=job.key,
            partition=r.partition,
            account=r.account,
            qos=r.qos,
            fields=job.fields,
        )


def write_scripts(chain: JobChain) -> None:
    """The job scripts, executable, and the folders their logs go to."""
    for job in chain.jobs:
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.script.parent.mkdir(parents=True, exist_ok=True)
        job.script.write_text(script.render(chain, job), encoding="utf-8")
        job.script.chmod(0o755)


def submit_all(chain: JobChain) -> list[Submitted]:
    """Submit in order. If Slurm refuses one midway (or the submission is stopped), the jobs already submitted are
    cancelled: a chain is submitted whole or not at all."""
    ids: dict[str, str] = {}
    submitted: list[Submitted] = []
    try:
        for job in chain.jobs:
            r = job.resources
            dep = script.dependency(job, ids)
            ids[job.key] = client.submit(
                job.script,
                dependency=dep,
                job=job.key,
                partition=r.partition,
                account=r.account,
                qos=r.qos,
                fields=job.fields,
            )
            log = Path(str(job.log).replace("%A", ids[job.key]).replace("%j", ids[job.key]))
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


def follow(
    submitted: Sequence[Submitted],
    ledger: Ledger,
    *,
    poll: float | Callable[[], float],
    say: Printer,
    resume: str,
) -> None:
    """Ask Slurm about the jobs every `poll` seconds until all have ended; Ctrl-C (KeyboardInterrupt, and so the
    SIGTERM a caller turns into one) cancels those still queued or running and waits for them to end. `poll` may
    be a function, asked every half second while waiting: a caller that sees its job finish sooner (a benchmark's
    final status) shortens the wait. `resume`: what the user may do when Slurm stops answering."""
    failures = 0
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


# --- the launcher ------------------------------------------------------------------------------------------------


class SlurmLauncher:
    """`--executor slurm`: the work as Slurm batch jobs, each running the planner's in-job entry point on its node
    through the same runtime as a local run."""

    name = "slurm"
    node = node

    def ready(self) -> None:
        client.require("sbatch")

    def job_text(self, chain: JobChain, job: Job) -> str:
        """The job as submitted: its script."""
        return script.render(chain, job)

    def chain_lines(self, heading: Sequence[str], chain: JobChain, order: str | None) -> list[str]:
        """Every job script of the chain after `heading`, then the sbatch lines in submission order; `order` (how
        the jobs wait for each other) heads them, and without it the one job's sbatch line stands alone."""
        lines = [*heading, *script.script_lines(chain), ""]
        if order is None:
            (job,) = chain.jobs
            return [*lines, "# ===== submission", script.display(client.submit_argv(job.script, None))]
        return [*lines, f"# ===== submission ({order})", *script.submission_lines(chain)]

    def dry_run_lines(self, work: Batch[Any]) -> list[str]:
        heading, chain = work.dry_run(self.name)
        return self.chain_lines(heading, chain, work.order)

    def launch(self, work: Batch[Any], *, argv: list[str], say: Printer) -> Any:
        self.ready()
        work.preflight()
        ledger = Ledger(work.folder, work.ledger)
        ledger.refuse_active()
        chain = work.jobs(say)
        if chain is None:
            return work.outcome([], say)
        validate(chain)
        with sigterm_interrupts():  # SIGTERM, like Ctrl-C, cancels the jobs (`follow`)
            work.write(chain, argv)
            try:
                write_scripts(chain)
                submitted = submit_all(chain)
            except BaseException:
                work.discard()
                raise
            with contextlib.ExitStack() as stack:
                try:
                    ledger.add(submitted, argv, runtime=chain.runtime, python=chain.python)
                    say(work.announce(submitted))
                    stack.enter_context(work.following(say))
                except BaseException:  # stopped before following began: the jobs go too
                    client.cancel([s.job_id for s in submitted])
                    raise
                follow(submitted, ledger, poll=work.poll, say=say, resume=work.resume)
        return work.outcome(submitted, say)
