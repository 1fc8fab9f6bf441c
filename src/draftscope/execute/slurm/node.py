"""Inside a Slurm job: what the Slurm launcher knows of the job a process runs in (`execute.base.JobNode`, reached
through `execute.injob.here`), whatever step it runs.

Slurm stops a job with SIGTERM, then SIGKILL after KillWait. `stop_grace` kills the step `MARGIN_S` before KillWait
runs out, so the record is written before Slurm's own SIGKILL; `explain_stop` asks Slurm why the job was stopped: a
time limit (`Reason=TimeLimit`) is `timed_out`, anything else (scancel, preemption) `interrupted`. `task_ends` is
Slurm's account of a job array's tasks, for the job after the array. The job's facts come from its environment
(`env`); outside a job every answer is the plain one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.execute.base import TaskEnd
from draftscope.execute.slurm import client, env, ledger, script, states
from draftscope.runtime import Context, Outcome
from draftscope.runtime.step import Step

name = "slurm"  # the launcher's name, and the key of a record's entry about its job
title = "Slurm"
SPREAD = script.SPREAD  # node count, rank, job id and first node, as the job script spells them
MARGIN_S = 2.0  # what the kit needs after stopping its step: ask Slurm why, write the record


def script_name(key: str) -> str:
    return f"{key}.sbatch"


def in_job() -> bool:
    return env.job_id() is not None


def job_id() -> str | None:
    """This job's id as squeue shows it: `12`, or `12_3` for a task of array 12."""
    array, task = env.array_job_id(), env.array_task_id()
    if array and task is not None:
        return f"{array}_{task}"
    return env.job_id()


def own_id() -> str | None:
    """SLURM_JOB_ID: unique per array task too."""
    return env.job_id()


def array_job_id() -> str | None:
    return env.array_job_id()


def nodes() -> str | None:
    return env.node_list()


def spread() -> tuple[str, str, str]:
    """A job over nodes (one srun task per node): (node count, this node's rank, the job id they share)."""
    return env.node_count() or "1", env.node_id() or "0", env.job_id() or "draftscope"


def record_entry(**more: Any) -> dict[str, Any]:
    """The `slurm` entry of a record this job writes: its id, its nodes, and `more`."""
    entry: dict[str, Any] = {"job_id": job_id() or "none", "nodes": nodes()}
    entry.update({k: v for k, v in more.items() if v is not None})
    return {name: entry}


def stop_grace(default: float = Context.grace_seconds) -> float:
    """How long the step may take to end after SIGTERM before the kit kills it, inside a job: short enough that
    the record is written before Slurm's own SIGKILL (KillWait after its SIGTERM, 30 s by default, often less)."""
    if not in_job():
        return default
    wait = client.kill_wait()
    return default if wait is None else max(1.0, min(default, wait - MARGIN_S))


def job_context(run_dir: Path) -> Context:
    """The runtime context of a step run inside a job (`stop_grace`)."""
    return Context(run_dir=run_dir, run_id=run_dir.name, grace_seconds=stop_grace())


def own_state() -> states.JobState | None:
    """This job's record in slurmctld (SLURM_JOB_ID is unique per array task too)."""
    ident = own_id()
    if not ident:
        return None
    try:
        found = client.show(ident)
    except UserError:
        return None
    return found[0] if found else None


def explain_stop(outcome: Outcome) -> Outcome:
    """An interrupted outcome inside a Slurm job, explained by Slurm: timed out, or cancelled / preempted."""
    if outcome.status == "interrupted" and in_job():
        status, reason = states.stop_cause(own_state())
        outcome = dataclasses.replace(outcome, status=status, reason=reason)
    return outcome


def classified(run: Callable[[Step, Context], Outcome]) -> Callable[[Step, Context], Outcome]:
    """`run`, with an interrupted outcome explained by Slurm (`explain_stop`)."""

    def execute(step: Step, ctx: Context) -> Outcome:
        return explain_stop(run(step, ctx))

    return execute


def task_ends(array: str) -> dict[int, TaskEnd]:
    """Task index → Slurm's record of that task of job array `array` (a task cancelled before it started may be
    kept as one record of a range, `12_[0-3]`: a task's own record wins); empty when Slurm does not answer."""
    try:
        found = client.show(array) or []
    except UserError:
        return {}
    ends: dict[int, TaskEnd] = {}
    for record in sorted(
        found, key=lambda r: not (r.array_task or "").isdigit()
    ):  # a task's record, then ranges
        if record.status:
            for index in states.task_indices(record.array_task or ""):
                ends.setdefault(index, record)
    return ends


def array_in(path: Path, stage: str) -> str | None:
    """The id of `stage`'s job array in the ledger's submission that holds this job (the job after the array)."""
    return ledger.array_in(path, stage, own_id())
