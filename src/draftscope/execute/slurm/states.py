"""Slurm job states → the run's status vocabulary, and the parsing of `scontrol show job -o`.

Facts this is built on (Slurm 22.05, measured on a single-node cluster; ../shared/reference/I-slurm.md):
- `scontrol show job -o ID` prints one line per job record, `Key=Value` words; a job array prints one line per
  task (`ArrayJobId`, `ArrayTaskId`), a pending array one line for its pending range (`ArrayTaskId=0-1`).
- A finished job stays visible for `MinJobAge` seconds (300 by default); `sacct` needs accounting storage, which
  many small clusters (and the test cluster) lack.
- While Slurm stops a job, the job reads `JobState=COMPLETING`: a time limit shows `Reason=TimeLimit`, a
  `scancel` `Reason=None`. The final state (`TIMEOUT`, `CANCELLED`) appears only once the job has ended.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from draftscope.execute.outcomes import worst

# Terminal states and the run status each maps to (run-manifest vocabulary).
TERMINAL: dict[str, str] = {
    "COMPLETED": "completed",
    "TIMEOUT": "timed_out",
    "DEADLINE": "timed_out",
    "CANCELLED": "interrupted",
    "PREEMPTED": "interrupted",
    "REVOKED": "interrupted",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
}
# Why each non-completed terminal state ended the job, in words.
EXPLAINED: dict[str, str] = {
    "TIMEOUT": "reached its Slurm time limit",
    "DEADLINE": "reached its Slurm deadline",
    "CANCELLED": "was cancelled (scancel)",
    "PREEMPTED": "was preempted by another job",
    "REVOKED": "was revoked (federated cluster)",
    "FAILED": "failed",
    "NODE_FAIL": "lost its node (NODE_FAIL)",
    "OUT_OF_MEMORY": "ran out of memory (OUT_OF_MEMORY)",
    "BOOT_FAIL": "could not boot its node (BOOT_FAIL)",
}
# A pending job whose reason says it can never start.
DEAD_PENDING = (
    "DependencyNeverSatisfied",
    "BadConstraints",
    "PartitionConfig",
    "InvalidAccount",
    "InvalidQOS",
)

_WORD = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")


@dataclass(frozen=True)
class JobState:
    """One job record (a job, or one task of an array) as `scontrol show job -o` reports it."""

    job_id: str  # as squeue shows it: "12", or "12_3" for an array task
    state: str  # PENDING, RUNNING, COMPLETED, …
    reason: str | None = None
    exit_code: str | None = None  # "code:signal"
    nodes: str | None = None
    run_time: str | None = None
    time_limit: str | None = None
    array_job_id: str | None = None
    array_task: str | None = None  # "3", or a pending range "0-1"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def dead(self) -> bool:
        """Pending, but Slurm says it can never start."""
        return self.state == "PENDING" and (self.reason or "") in DEAD_PENDING

    @property
    def status(self) -> str | None:
        """The run status of a finished job; None while it may still run."""
        if self.dead:
            return "interrupted"
        return TERMINAL.get(self.state)

    def explain(self) -> str:
        """One line: what happened to the job, with Slurm's own words."""
        if self.dead:
            return f"job {self.job_id} can never start ({self.reason})"
        what = EXPLAINED.get(self.state, self.state.lower())
        details = []
        if self.exit_code and self.exit_code not in ("0:0",):
            code, _, sig = self.exit_code.partition(":")
            details.append(f"exit code {code}" + (f", signal {sig}" if sig not in ("", "0") else ""))
        if self.reason and self.reason not in ("None", "NonZeroExitCode"):
            details.append(f"reason {self.reason}")
        if self.nodes and self.nodes != "(null)":
            details.append(f"on {self.nodes}")
        return f"job {self.job_id} {what}" + (f" ({', '.join(details)})" if details else "")


def parse_show_job(text: str) -> list[JobState]:
    """The records of `scontrol show job -o …` (one per line). Values with spaces (Command=, Comment=) are cut
    at the first space; none of the fields read here contain one."""
    found = []
    for line in text.splitlines():
        words = dict(_WORD.findall(line))
        if "JobId" not in words or "JobState" not in words:
            continue
        array_job, task = words.get("ArrayJobId"), words.get("ArrayTaskId")
        if array_job and task is not None:
            # squeue's form: 12_3 for a task, 12_[0-7] for the tasks still pending as one record
            shown = f"{array_job}_{task}" if task.isdigit() else f"{array_job}_[{task}]"
        else:
            shown = words["JobId"]
        found.append(
            JobState(
                job_id=shown,
                state=words["JobState"],
                reason=words.get("Reason"),
                exit_code=words.get("ExitCode"),
                nodes=words.get("NodeList"),
                run_time=words.get("RunTime"),
                time_limit=words.get("TimeLimit"),
                array_job_id=array_job,
                array_task=task,
            )
        )
    return found


def seconds(text: str | None) -> float | None:
    """Slurm's `[D-]HH:MM:SS` (or MM:SS) as seconds; None for UNLIMITED, N/A or nothing."""
    if not text or not re.fullmatch(r"(\d+-)?\d+(:\d+){1,2}", text):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def task_indices(text: str) -> list[int]:
    """The task indices of an `ArrayTaskId` value: `3`, `0-7`, `0,2-3`, `0-7%2` (a throttle)."""
    indices: list[int] = []
    for part in text.split("%")[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            indices += range(int(first), int(last or first) + 1)
    return indices


def stop_cause(record: JobState | None) -> tuple[str, str]:
    """Inside a job that Slurm is stopping (SIGTERM): (status, reason). A time limit shows as `Reason=TimeLimit`
    (or a run time at the limit) while the job is COMPLETING; anything else is a cancellation or preemption."""
    if record is None:
        return "interrupted", "stopped by a signal (SIGTERM); Slurm did not say why"
    run, limit = seconds(record.run_time), seconds(record.time_limit)
    if (
        record.state in ("TIMEOUT", "DEADLINE")
        or record.reason == "TimeLimit"
        or (run is not None and limit is not None and run >= limit)
    ):
        return (
            "timed_out",
            f"Slurm time limit of {record.time_limit} reached (job {record.job_id}); the step was stopped",
        )
    if record.state == "PREEMPTED" or record.reason == "Preempted":
        return "interrupted", f"job {record.job_id} was preempted; the step was stopped"
    return "interrupted", f"job {record.job_id} was cancelled (scancel); the step was stopped"


def summarize(records: Sequence[JobState]) -> tuple[str, str | None]:
    """(status, reason) of a finished job or job array: the worst task's, explained."""
    statuses = [r.status or "failed" for r in records]
    status = worst(statuses)
    if status == "completed":
        return status, None
    first = next(r for r, s in zip(records, statuses, strict=True) if s == status)
    others = sum(1 for s in statuses if s != "completed") - 1
    return status, first.explain() + (f"; {others} more task(s) did not complete" if others > 0 else "")
