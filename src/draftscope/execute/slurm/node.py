"""Inside a Slurm job: what every in-job entry point needs (the pipeline's `python -m draftscope.pipeline.slurm`, a
benchmark's `python -m draftscope.bench.slurm`), whatever step it runs.

Slurm stops a job with SIGTERM, then SIGKILL after KillWait. `stops_interrupt` turns the SIGTERM into the
KeyboardInterrupt the runtimes already handle (they stop the step: its container by name, or the local process
group); `stop_grace` kills the step `MARGIN_S` before KillWait runs out, so the record is written before Slurm's
own SIGKILL; `explain_stop` asks Slurm why the job was stopped: a time limit (`Reason=TimeLimit`) is `timed_out`,
anything else (scancel, preemption) `interrupted`. `remove_container` is the job script's SIGTERM trap: `scancel`
ends the engine's client but not the container it started. `main_guard` gives every in-job command the same exit
codes: 2 for a user error (one line), 143 when stopped before anything could be recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError, run_main
from draftscope.execute.slurm import client, states
from draftscope.runtime import Context, Outcome
from draftscope.runtime.step import Step

Say = Callable[[str], None]
MARGIN_S = 2.0  # what the kit needs after stopping its step: ask Slurm why, write the record


def say(text: str) -> None:
    print(text, flush=True)


def job_id() -> str | None:
    """This job's id as squeue shows it: `12`, or `12_3` for a task of array 12."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task is not None:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def slurm_entry(**more: Any) -> dict[str, Any]:
    """The `slurm` entry of a record this job writes: its id, its nodes, and `more`."""
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


def stop_grace(default: float = Context.grace_seconds) -> float:
    """How long the step may take to end after SIGTERM before the kit kills it, inside a job: short enough that
    the record is written before Slurm's own SIGKILL (KillWait after its SIGTERM, 30 s by default, often less)."""
    if not os.environ.get("SLURM_JOB_ID"):
        return default
    wait = client.kill_wait()
    return default if wait is None else max(1.0, min(default, wait - MARGIN_S))


def job_context(run_dir: Path) -> Context:
    """The runtime context of a step run inside a job (`stop_grace`)."""
    return Context(run_dir=run_dir, run_id=run_dir.name, grace_seconds=stop_grace())


def own_state() -> states.JobState | None:
    """This job's record in slurmctld (SLURM_JOB_ID is unique per array task too)."""
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


def remove_container(engine: str | None, name: str) -> None:
    """Remove a container now, by the name the runtime gave it (docker, podman; anything else has none)."""
    if engine not in ("docker", "podman"):
        return
    # No grace: Slurm's SIGKILL follows within KillWait; --init has already passed SIGTERM to the step.
    extra = ["--time", "0"] if engine == "podman" else []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([engine, "rm", "--force", *extra, name], capture_output=True, timeout=30, check=False)


def main_guard(fn: Callable[[], int]) -> int:
    """Run an in-job command under Slurm's SIGTERM handling: user errors as one line (exit 2, `run_main`), a stop
    before anything could be recorded as 143."""
    try:
        with stops_interrupt():
            return run_main(fn)
    except KeyboardInterrupt:
        print("stopped (SIGTERM) before the step could be recorded", file=sys.stderr, flush=True)
        return 143
