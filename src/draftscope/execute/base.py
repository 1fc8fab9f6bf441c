"""The launcher interface: how a planner (the pipeline, a benchmark) hands its work to a launcher, and what a batch
launcher hands back. A launcher decides *where* the planner's supervisor runs; a runtime (`draftscope.runtime`:
docker, podman, local) decides how each step runs there. The two combine freely (a Slurm job runs its step in
podman, docker or the node's Python environment), so a runtime is not a launcher and no launcher runs a container
itself.

- `Launcher`: `ready` (its own preconditions: the Slurm launcher's client commands), `dry_run_lines` (what a
  launch would write and run; pure) and `launch` (run the work; the planner's outcome). A batch launcher also
  names its in-job side (`node`), renders one job as submitted (`job_text`) and prints a chain (`chain_lines`).
- `Work`: what every planner hands any launcher; the local launcher runs it here (`run_here`, `dry_run_here`).
- `Batch`: the same work as a chain of jobs (`execute.plan`) with the planner's part of a submission: its
  refusals, the files the jobs read, what is said, and how the jobs' ends become its outcome (`Ended`).
- `JobNode`: what a job asks the launcher that submitted it, on its node (`execute.injob.here`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from draftscope.execute.plan import Job, JobChain
from draftscope.runtime import Context, Outcome
from draftscope.runtime.step import Step

Printer = Callable[[str], None]
Run = Callable[[Step, Context], Outcome]
R = TypeVar("R")
# How often a batch launcher asks about its jobs: the pipeline's default, and a benchmark's.
POLL_INTERVAL_S = 5.0
LEDGER_FILE = "jobs.json"  # a batch submission's ledger, in the folder the planner chooses


class TaskEnd(Protocol):
    """One job record (a job, or one task of an array) as the scheduler reports it."""

    job_id: str
    state: str
    reason: str | None
    exit_code: str | None
    nodes: str | None

    @property
    def status(self) -> str | None:
        """The run status of a finished job; None while it may still run."""
        ...

    def explain(self) -> str:
        """One line: what happened to the job, in the scheduler's own words."""
        ...


class Ended(Protocol):
    """A submitted job, followed to its end: what a planner's outcome is made from."""

    job: Job
    job_id: str
    log: Path
    status: str | None
    reason: str | None
    records: Sequence[TaskEnd]


class Work(Protocol[R]):
    """What a planner hands any launcher: the work, run in this process by the local launcher."""

    def run_here(self, *, argv: list[str], say: Printer) -> R: ...

    def dry_run_here(self) -> list[str]: ...


class Batch(Work[R], Protocol[R]):
    """The same work as a chain of jobs, with the planner's part of a submission. The launcher runs these in order:
    `preflight`, `jobs`, (its checks), `write`, (its scripts, the submission; `discard` if that fails), `announce`,
    `following` around its wait, `outcome`."""

    @property
    def folder(self) -> Path:
        """What the ledger's log paths are relative to."""
        ...

    @property
    def ledger(self) -> Path:
        """The ledger (`jobs.json`): every submission for this work, and a guard against racing an earlier one."""
        ...

    @property
    def resume(self) -> str:
        """What the user may do when the scheduler stops answering."""
        ...

    @property
    def order(self) -> str | None:
        """How the jobs wait for each other, for the dry run; None for one job nothing waits for."""
        ...

    def preflight(self) -> None:
        """Everything the planner refuses before anything is written, on the submitting host."""
        ...

    def jobs(self, say: Printer) -> JobChain | None:
        """The jobs to submit; None when nothing is left to run."""
        ...

    def dry_run(self, executor: str) -> tuple[list[str], JobChain]:
        """The dry run's heading and the jobs a submission of the whole work would be."""
        ...

    def write(self, chain: JobChain, argv: list[str]) -> None:
        """The files the jobs read, written before their scripts."""
        ...

    def discard(self) -> None:
        """The submission failed before any job was queued: remove what `write` created."""
        ...

    def announce(self, submitted: Sequence[Ended]) -> str: ...

    def poll(self) -> float:
        """Seconds until the launcher asks again (asked every half second while waiting: an answer may shorten
        the wait)."""
        ...

    def following(self, say: Printer) -> AbstractContextManager[Any]:
        """Around the wait for the jobs (a benchmark's progress from its records)."""
        ...

    def outcome(self, submitted: Sequence[Ended], say: Printer) -> R:
        """The planner's outcome once every job has ended (none submitted: nothing was left to run)."""
        ...


class JobNode(Protocol):
    """A batch launcher's jobs: how a planner names and spells them (`script_name`, `SPREAD`), and, inside a job,
    what the launcher knows of it (its scheduler's environment and commands). Outside any job every answer is the
    plain one: no id, one node, rank 0, the default grace."""

    name: str  # the launcher, and the key of a record's entry about the job
    title: str  # the scheduler's name in a sentence ("Slurm job 12")
    SPREAD: tuple[
        str, str, str, str
    ]  # a job over nodes: the words for node count, rank, shared id, first node

    def script_name(self, key: str) -> str:
        """The file name of job `key`'s script."""
        ...

    def in_job(self) -> bool: ...

    def job_id(self) -> str | None:
        """The job's id as the scheduler shows it (an array task's with its index)."""
        ...

    def own_id(self) -> str | None:
        """This process's own job id (an array task's unique one)."""
        ...

    def array_job_id(self) -> str | None: ...

    def nodes(self) -> str | None: ...

    def spread(self) -> tuple[str, str, str]:
        """A job over nodes: (node count, this node's rank, an id every node shares)."""
        ...

    def record_entry(self, **more: Any) -> dict[str, Any]:
        """The entry a record this job writes gains: `{name: {job id, nodes, **more}}`."""
        ...

    def stop_grace(self) -> float:
        """How long a stopped step may take to end before the kit kills it: within the scheduler's own grace."""
        ...

    def job_context(self, run_dir: Path) -> Context:
        """The runtime context of a step in this job (`stop_grace`)."""
        ...

    def explain_stop(self, outcome: Outcome) -> Outcome:
        """An interrupted outcome, explained by the scheduler (time limit, cancellation); others as they are."""
        ...

    def classified(self, run: Run) -> Run:
        """`run`, its outcome explained (`explain_stop`)."""
        ...

    def task_ends(self, array: str) -> dict[int, TaskEnd]:
        """Task index → the scheduler's record of it, for a job array; empty when it does not answer."""
        ...

    def array_in(self, ledger: Path, stage: str) -> str | None:
        """The id of `stage`'s job array in the ledger's submission that holds this job; None when none says."""
        ...


class Launcher(Protocol):
    name: str
    node: JobNode | None  # a batch launcher's in-job side; None for the local launcher (no job)

    def ready(self) -> None: ...

    def dry_run_lines(self, work: Any) -> list[str]: ...

    def launch(self, work: Any, *, argv: list[str], say: Printer) -> Any: ...


class BatchLauncher(Launcher, Protocol):
    """A launcher that submits jobs: its in-job side, and the pure renderings a planner's dry run and tests use."""

    node: JobNode

    def job_text(self, chain: JobChain, job: Job) -> str:
        """The job as submitted (a Slurm job's script)."""
        ...

    def chain_lines(self, heading: Sequence[str], chain: JobChain, order: str | None) -> list[str]:
        """The dry run of a chain: `heading`, every job as submitted, then the submission itself."""
        ...
