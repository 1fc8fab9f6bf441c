"""Job scripts and `sbatch` lines from a chain of jobs (`execute.plan`). Pure: nothing is written and nothing is run
here, so a dry run prints exactly what a submission writes and submits.

A script is the #SBATCH lines (resources, array, output, working directory), the job's comment lines, then the kit:
`python -m <module> <command> <args>` started in the background under a SIGTERM trap. Slurm stops a job with
SIGTERM to every process of the job and SIGKILL after KillWait; the trap first runs the job's cleanup command (a
container is the engine's, not a process of the job, so `scancel` alone leaves it running), then waits for the kit
to record how its step ended. A job spread over nodes runs the kit once per node through `srun`, each told the
allocation's first node as the rendezvous.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from draftscope.execute.plan import Job, JobChain, Resources, display
from draftscope.execute.slurm.client import submit_argv

# A job over nodes, as its script spells them: the node count, each node's rank, the job id they share (Slurm sets
# these on every node), and the allocation's first node (the script's own variable, the rendezvous host).
SPREAD = ("$SLURM_NNODES", "$SLURM_NODEID", "$SLURM_JOB_ID", "$head_node")


def slurm_time(total_minutes: int) -> str:
    """`--time` as D-HH:MM:SS (Slurm counts whole minutes)."""
    days, rest = divmod(total_minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def sbatch_header(
    name: str, output: Path, chdir: Path, res: Resources, *, array: str | None = None
) -> list[str]:
    """A job script's first lines: the shebang and the #SBATCH options (sbatch reads quoted values like the
    shell)."""
    q = shlex.quote
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={q(str(output))}",
        f"#SBATCH --chdir={q(str(chdir))}",
        "#SBATCH --open-mode=append",
    ]
    if array:
        head.append(f"#SBATCH --array={array}")
    head += [f"#SBATCH --nodes={res.nodes}", "#SBATCH --ntasks-per-node=1"]
    if res.cpus_per_task:
        head.append(f"#SBATCH --cpus-per-task={res.cpus_per_task}")
    if res.mem:
        head.append(f"#SBATCH --mem={res.mem}")
    if res.gpus:
        head.append(f"#SBATCH --gres=gpu:{res.gpus}")
    if res.exclusive:
        head.append("#SBATCH --exclusive")
    if res.minutes:
        head.append(f"#SBATCH --time={slurm_time(res.minutes)}")
    for flag, value in (("partition", res.partition), ("account", res.account), ("qos", res.qos)):
        if value:
            head.append(f"#SBATCH --{flag}={value}")
    return head


def job_body(python: str, job: Job) -> list[str]:
    """The script's commands: the kit (`python -m <module>`, the submitting host's interpreter) started in the
    background with the job's arguments, and a SIGTERM trap that runs the job's cleanup command (when it has one)
    and waits for the kit to record how the step ended."""
    q = shlex.quote
    run = job.run
    args = " ".join(q(a) for a in run.args)
    if job.array and run.task_flag:
        args += f' {run.task_flag} "$SLURM_ARRAY_TASK_ID"'
    if run.rendezvous:
        flag, port = run.rendezvous
        gres = f" --gres=gpu:{job.resources.gpus}" if job.resources.gpus else ""
        count, head = SPREAD[0], SPREAD[3]
        launch = [
            f'{head[1:]}=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f'srun --nodes="{count}" --ntasks-per-node=1{gres} --kill-on-bad-exit=1 \\',
            f'  "${{kit[@]}}" {run.command} "${{args[@]}}" {flag} "{head}:{port}" &',
        ]
    else:
        launch = [f'"${{kit[@]}}" {run.command} "${{args[@]}}" &']
    body = [
        "set -u",
        f"kit=({q(python)} -m {run.module})",
        f"args=({args})",
        'child=""',
        "# Slurm sends SIGTERM to every process of the job (scancel, time limit), then SIGKILL after KillWait.",
        "on_term() {",
    ]
    if run.cleanup:
        body.append(
            f'  "${{kit[@]}}" {run.cleanup} "${{args[@]}}"  # the container outlives its client otherwise'
        )
    body += [
        '  if [ -n "$child" ]; then wait "$child"; fi  # the kit records how the step ended',
        "  exit 143",
        "}",
        "trap on_term TERM",
        *launch,
        "child=$!",
        'wait "$child"',
    ]
    return body


def render(chain: JobChain, job: Job) -> str:
    """The job script: #SBATCH lines, what it runs (comments), then the kit under its SIGTERM trap."""
    head = sbatch_header(job.name, job.log, job.chdir, job.resources, array=job.array)
    about = [f"# {line}" for line in job.about]
    return "\n".join([*head, "#", *about, *job_body(chain.python, job)]) + "\n"


def dependency(job: Job, ids: Mapping[str, str]) -> str | None:
    """`afterok:<id>[:<id>…]` (and `afterany:` for a job that runs however the others ended), from the ids of the
    jobs it waits for."""
    parts = []
    if job.after_ok:
        parts.append("afterok:" + ":".join(ids[k] for k in job.after_ok))
    if job.after_any:
        parts.append("afterany:" + ":".join(ids[k] for k in job.after_any))
    return ",".join(parts) or None


def variable(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def submission_lines(chain: JobChain) -> list[str]:
    """The sbatch lines in submission order, each job's id kept in a shell variable that later jobs depend on (as
    `launcher.submit_all` runs them, with the ids as variables)."""
    placeholders = {j.key: f"${variable(j.key)}" for j in chain.jobs}
    return [
        f"{variable(job.key)}=$({display(submit_argv(job.script, dependency(job, placeholders)))})"
        for job in chain.jobs
    ]


def script_lines(chain: JobChain) -> list[str]:
    """Every job script of the chain, each after a `# ===== <path>` line."""
    lines: list[str] = []
    for job in chain.jobs:
        lines += ["", f"# ===== {job.script}", *render(chain, job).rstrip("\n").splitlines()]
    return lines
