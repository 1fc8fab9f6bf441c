"""What a batch launcher consumes: a chain of jobs, each a step the kit runs on a node, with its resources and the
jobs it waits for. Planners above (the pipeline: `pipeline/batch/`; a benchmark: `bench/batch.py`) decide which
jobs their work becomes and what each runs; a batch launcher (`execute/slurm/`) renders, checks, submits, follows
and cancels them, and never imports a planner: everything it needs about a job is in these types.

- `Resources`: what a job asks the scheduler for; `step_resources` derives them from a runtime `Step` by one rule
  for every planner (a step on "all GPUs" takes whole nodes; a CPU step one CPU).
- `Placement`: the scheduler options a user sets (partition, account, QOS, time limit, CPUs, memory).
- `InJob`: what a job runs on its node — `python -m <module> <command> <args>` — and how its launcher helps it
  stop (the SIGTERM trap's cleanup command), spread over nodes (one task per node, a rendezvous), or learn its
  array index.
- `Job`, `JobChain`: a job (key, kind, resources, array size, dependencies, script, log, what it runs) and the
  jobs of one submission with the interpreter they run the kit with.
- `display`: an argv as the shell words a job's comments and the dry runs show.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draftscope.runtime.step import Step

# The runtime stops a step at its own time limit and records `timed_out` itself; the scheduler's limit comes a
# minute later (whole minutes, rounded up) as the backstop for a job that cannot stop.
TIME_MARGIN_S = 60.0

# "resources" / "time" → (the field that sets it, the fix): what a refusal by the scheduler names.
Fields = Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class Resources:
    nodes: int = 1
    gpus: int = 0  # per node
    exclusive: bool = False  # whole nodes: a step that uses "all GPUs" sees every GPU of its node
    cpus_per_task: int | None = None
    mem: str | None = None
    minutes: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None


@dataclass(frozen=True)
class Placement:
    """The scheduler options a user sets for a job (the pipeline's `slurm.stages.<stage>`, a benchmark's flags)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_s: float | None = None  # --time (whole minutes, rounded up)
    cpus_per_task: int | None = None
    mem: str | None = None  # --mem: per node, e.g. 64G; 0 = all of the node's memory


@dataclass(frozen=True)
class InJob:
    """What a job script runs on its node: `<python> -m <module> <command> <args>`, in the background, under a
    SIGTERM trap that runs `<module> <cleanup> <args>` first (when set) and then waits for the command to record
    how its step ended."""

    module: str  # the in-job entry point, e.g. "draftscope.pipeline.batch"
    command: str  # its subcommand, e.g. "run-step"
    args: tuple[str, ...] = ()  # shared by the command and the cleanup
    task_flag: str | None = None  # a job array: the option that passes each task its index
    # The trap's subcommand: remove the job's container (the engine's, not the job's).
    cleanup: str | None = None
    rendezvous: tuple[str, int] | None = None  # one task per node: the option naming node 0, and its port


@dataclass(frozen=True)
class Job:
    key: str  # unique in its chain: file and shell variable names ("regen", "regen.merge", "benchmark")
    stage: str  # what the job is part of (a pipeline stage, "fetch", "benchmark"): the ledger's `stage`
    kind: str  # the planner's word for the job, kept in the ledger (one of its schema's: step, shards, merge, …)
    name: str  # the scheduler's name for the job
    resources: Resources
    run: InJob
    script: Path  # where the job script is written
    log: Path  # the job's output; the scheduler fills in %j (the job id), %A_%a (array and task)
    chdir: Path  # the job's working directory
    array_size: int = 0  # tasks of a job array; 0: not an array
    after_ok: tuple[str, ...] = ()  # keys of the jobs this one waits for, successfully ended
    after_any: tuple[str, ...] = ()  # keys of the jobs this one waits for, however they ended
    about: tuple[str, ...] = ()  # comment lines of the script: what the job runs
    fields: Fields = field(default_factory=dict)  # what a refusal names ("resources", "time")

    @property
    def array(self) -> str | None:
        return f"0-{self.array_size - 1}" if self.array_size else None


@dataclass(frozen=True)
class JobChain:
    """The jobs of one submission, in submission order (a job waits only for jobs before it)."""

    runtime: str  # the runtime the jobs run their steps with (the ledger's `runtime`)
    python: str  # the interpreter each job runs the kit with (the submitting one: shared storage)
    jobs: tuple[Job, ...]

    def job(self, key: str) -> Job:
        return next(j for j in self.jobs if j.key == key)


def minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def step_resources(
    step: Step,
    opts: Placement,
    *,
    all_gpus: int,
    seconds: float | None,
    margin: float = TIME_MARGIN_S,
    nodes: int = 1,
) -> Resources:
    """A Step's job resources (the pipeline's stages and the benchmark alike). A step on "all GPUs" takes whole
    nodes (`all_gpus` GPUs each, `--exclusive`, `--mem=0`): its container sees every GPU of its node; a CPU step
    one CPU unless set. The time limit: `opts.time_limit_s`, else `seconds` (the step's own limit) + `margin`,
    else none (the partition's default)."""
    whole_node = step.gpus < 0
    gpus = all_gpus if whole_node else step.gpus
    if opts.time_limit_s is not None:
        limit = minutes(opts.time_limit_s)
    elif seconds is not None:
        limit = minutes(seconds + margin)
    else:
        limit = None
    return Resources(
        nodes=nodes,
        gpus=gpus,
        exclusive=whole_node,
        cpus_per_task=opts.cpus_per_task or (None if whole_node else 1),
        mem=opts.mem or ("0" if whole_node else None),
        minutes=limit,
        partition=opts.partition,
        account=opts.account,
        qos=opts.qos,
    )


# A word made of safe characters and `$name` references: printed unquoted, so that the shell expands them.
_WITH_VARIABLES = re.compile(r"[\w\-=:.,/]*(\$[A-Za-z_]\w*[\w\-=:.,/]*)+")


def display(argv: Sequence[str]) -> str:
    """An argv as shell words: quoted, except the `$name` placeholders a job (or the dry run's script) fills in."""
    return " ".join(a if _WITH_VARIABLES.fullmatch(a) else shlex.quote(a) for a in argv)
