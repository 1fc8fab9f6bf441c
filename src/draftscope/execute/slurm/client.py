"""The Slurm commands the kit calls: `sbatch`, `scontrol`, `scancel`, `sinfo`. Argv lists, never a shell.

Each failure becomes a one-line `UserError` that names the command, Slurm's own message and the fix: a missing
client, an unknown partition, an account or QOS the cluster refuses, resources no node has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from draftscope.core.errors import UserError
from draftscope.execute.plan import Fields
from draftscope.execute.slurm.states import JobState, parse_show_job

INSTALL_FIX = (
    "run this on a login node of the cluster, or install Slurm's client commands "
    "(Debian/Ubuntu: apt-get install slurm-client) configured for your cluster (/etc/slurm/slurm.conf or SLURM_CONF)"
)
TIMEOUT_S = 60.0


def require(command: str = "sbatch") -> str:
    path = shutil.which(command)
    if path is None:
        raise UserError(
            f"'{command}' is not on PATH; the slurm executor submits with Slurm's commands",
            field="--executor",
            value="slurm",
            fix=INSTALL_FIX,
        )
    return path


def _run(
    argv: Sequence[str], timeout: float = TIMEOUT_S, stdin: str | None = None
) -> subprocess.CompletedProcess:
    require(argv[0])
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=stdin
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"'{argv[0]}' did not answer within {timeout:g} s",
            field="--executor",
            value="slurm",
            fix="check that slurmctld is up (scontrol ping)",
        ) from None


def _message(result: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (result.stderr or result.stdout or "").splitlines() if line.strip()]
    return " / ".join(lines[-2:]) or f"exit code {result.returncode}"


def explain_refusal(
    message: str,
    *,
    job: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    fields: Fields,
) -> UserError:
    """An sbatch refusal as a one-line error naming the field the user can change. `fields`: which fields size
    the job and how to change them (the planner's: "resources" and "time" → (field, fix))."""
    text = message.lower()
    if "invalid partition" in text:
        known = ", ".join(partitions()) or "none"
        return UserError(
            f"Slurm refused job {job}: {message}",
            field="--partition",
            value=partition,
            fix=f"use one of this cluster's partitions ({known})",
        )
    if "account" in text:
        return UserError(
            f"Slurm refused job {job}: {message}",
            field="--account",
            value=account,
            fix="use an account you may charge (sacctmgr show assoc user=$USER)",
        )
    if "qos" in text:
        return UserError(
            f"Slurm refused job {job}: {message}",
            field="--qos",
            value=qos,
            fix="use a QOS of your association, or leave --qos out",
        )
    if "node configuration is not available" in text or "gres" in text or "memory" in text:
        field, fix = fields["resources"]
        return UserError(
            f"Slurm refused job {job}: {message}",
            field=field,
            fix=f"no node of the partition has these resources ({fix}): change them or the partition "
            "(sinfo -o '%P %c %m %G %D')",
        )
    if "time limit" in text:
        field, fix = fields["time"]
        return UserError(
            f"Slurm refused job {job}: {message}",
            field=field,
            fix="stay within the partition's MaxTime (sinfo -o '%P %l')" + fix,
        )
    return UserError(
        f"Slurm refused job {job}: {message}",
        field="--executor",
        value="slurm",
        fix="read Slurm's message; the job script is in the workdir's slurm/ folder",
    )


def test_only(
    script: str,
    *,
    job: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    fields: Fields,
) -> None:
    """`sbatch --test-only` with the script on stdin: Slurm validates it and its resources (partition, account,
    QOS, nodes, GPUs) and submits nothing; nothing needs to be written first."""
    result = _run(["sbatch", "--test-only"], stdin=script)
    if result.returncode != 0:
        raise explain_refusal(
            _message(result), job=job, partition=partition, account=account, qos=qos, fields=fields
        )


def submit(
    script: Path,
    *,
    dependency: str | None,
    job: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    fields: Fields,
) -> str:
    """Submit with `sbatch --parsable`; the job id. A job whose dependency fails is cancelled by Slurm itself
    (`--kill-on-invalid-dep=yes`), so nothing waits forever behind a failed stage, with or without the kit."""
    result = _run(submit_argv(script, dependency))
    if result.returncode != 0:
        raise explain_refusal(
            _message(result), job=job, partition=partition, account=account, qos=qos, fields=fields
        )
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise UserError(f"sbatch printed no job id for {job}: {result.stdout.strip()!r}", field="--executor")
    return job_id


def submit_argv(script: Path | str, dependency: str | None) -> list[str]:
    argv = ["sbatch", "--parsable"]
    if dependency:
        argv += [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"]
    return [*argv, str(script)]


def show(job_id: str) -> list[JobState] | None:
    """The job's records (an array: one per task); None when Slurm no longer knows the job (purged after
    MinJobAge, or never submitted)."""
    result = _run(["scontrol", "show", "job", "-o", job_id])
    if result.returncode != 0:
        if "invalid job id" in (result.stderr + result.stdout).lower():
            return None
        raise UserError(
            f"scontrol show job {job_id}: {_message(result)}",
            field="--executor",
            value="slurm",
            fix="check that slurmctld is up (scontrol ping)",
        )
    return parse_show_job(result.stdout)


def kill_wait() -> float | None:
    """The cluster's KillWait (seconds between Slurm's SIGTERM and its SIGKILL), from `scontrol show config`;
    None when Slurm does not say."""
    try:
        result = _run(["scontrol", "show", "config"], timeout=10)
    except UserError:
        return None
    found = re.search(r"^KillWait\s*=\s*(\d+)", result.stdout, re.MULTILINE)
    return float(found.group(1)) if result.returncode == 0 and found else None


def cancel(job_ids: Sequence[str]) -> None:
    """`scancel` the jobs (array jobs whole). Ids Slurm no longer knows are ignored."""
    if job_ids:
        _run(["scancel", *job_ids])


def partitions() -> list[str]:
    """The cluster's partition names (the default one first, as sinfo marks it with '*')."""
    try:
        result = _run(["sinfo", "-h", "-o", "%P"])
    except UserError:
        return []
    names = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return sorted(dict.fromkeys(n.rstrip("*") for n in names), key=lambda n: f"{n}*" not in names)
