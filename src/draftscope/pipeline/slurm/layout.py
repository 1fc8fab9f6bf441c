"""Where a pipeline submission's files go in its workdir: the job scripts, `plan.json` and the ledger in `slurm/`,
the jobs' output in `logs/` beside the stage logs. Read by the host that submits and by the jobs (the job after a
job array finds its array in the ledger)."""

from __future__ import annotations

from pathlib import Path

from draftscope.execute.slurm.ledger import JOBS_FILE

SLURM_DIR = "slurm"
PLAN_FILE = "plan.json"
LOGS_DIR = "logs"


def folder(workdir: Path) -> Path:
    return workdir / SLURM_DIR


def ledger_path(workdir: Path) -> Path:
    return workdir / SLURM_DIR / JOBS_FILE


def script_path(workdir: Path, key: str) -> Path:
    return workdir / SLURM_DIR / f"{key}.sbatch"


def log_path(workdir: Path, key: str, *, array: bool) -> Path:
    return workdir / LOGS_DIR / f"slurm-{key}-{'%A_%a' if array else '%j'}.out"
