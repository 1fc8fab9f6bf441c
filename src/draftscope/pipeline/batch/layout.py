"""Where a pipeline submission's files go in its workdir: the job scripts, `plan.json` and the ledger in `slurm/`,
the jobs' output in `logs/` beside the stage logs. Read by the host that submits and by the jobs (the job after a
job array finds its array in the ledger). The folder keeps its name, `slurm/`, whichever launcher submitted."""

from __future__ import annotations

from pathlib import Path

from draftscope.execute.base import LEDGER_FILE
from draftscope.execute.injob import here

JOBS_DIR = "slurm"
PLAN_FILE = "plan.json"
LOGS_DIR = "logs"


def folder(workdir: Path) -> Path:
    return workdir / JOBS_DIR


def ledger_path(workdir: Path) -> Path:
    return workdir / JOBS_DIR / LEDGER_FILE


def script_path(workdir: Path, key: str) -> Path:
    return workdir / JOBS_DIR / here().script_name(key)


def log_path(workdir: Path, key: str, *, array: bool) -> Path:
    return workdir / LOGS_DIR / f"slurm-{key}-{'%A_%a' if array else '%j'}.out"
