"""The ledger, `jobs.json` (schema `slurm-jobs`): every submission of the kit to Slurm for one folder — the command that
submitted it, and per job its id, dependency, log file and, once followed to its end, Slurm's states of its tasks
and the run status they map to. Where it lives is the planner's to say (a pipeline's `slurm/jobs.json`, a
benchmark's `<run>.slurm/jobs.json`); a second submission reads it to refuse racing the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.provenance import command_line, now
from draftscope.core.schema import check
from draftscope.execute.base import LEDGER_FILE
from draftscope.execute.plan import Job
from draftscope.execute.slurm import client
from draftscope.execute.slurm.states import JobState

JOBS_FILE = LEDGER_FILE
LEDGER_VERSION = 1
LEDGER_SCHEMA = "slurm-jobs"


@dataclass
class Submitted:
    job: Job
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
    """`path` (a `jobs.json`): every submission to one folder, its jobs, their ids, states and logs. Log paths are
    kept relative to `workdir`."""

    def __init__(self, workdir: Path, path: Path) -> None:
        self.workdir = workdir
        self.path = path
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


def array_in(path: Path, stage: str, job_id: str | None) -> str | None:
    """The id of `stage`'s job array (its `shards` job) in the latest submission of ledger `path` that holds job
    `job_id` (the job after the array); None when no submission does, or without a ledger (a job run by hand, a
    torn file)."""
    try:
        submissions = list(read_json(path)["submissions"])
    except Exception:
        return None
    for submission in reversed(submissions):
        jobs = [j for j in submission.get("jobs") or () if isinstance(j, dict)]
        if job_id and any(j.get("job_id") == job_id for j in jobs):
            return next(
                (str(j["job_id"]) for j in jobs if j.get("stage") == stage and j.get("kind") == "shards"),
                None,
            )
    return None
