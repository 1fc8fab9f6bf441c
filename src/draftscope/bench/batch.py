"""`invoke benchmark --executor slurm`: one benchmark as one batch job, through the same plan.

Inside the job the kit's supervisor runs on the compute node as a local run's would (`python -m draftscope.bench.batch
run-benchmark`, the submitting host's Python: `supervisor.run_benchmark` with the config frozen at submission),
so the run directory, its manifest, records, time limit (`--max-seconds`) and container runtime are a local
run's. The submitting side hands the launcher this benchmark's part of a submission (`BenchmarkWork`, an
`execute.base.Batch`); the launcher submits, follows and cancels the job.

Files (the run directory itself must not exist before the supervisor creates it exclusively, so the job's files
sit next to it, in `<run>.slurm/`, created exclusively at submission):

    <run>.slurm/benchmark.<script>  the job script (its name is the launcher's)
    <run>.slurm/benchmark.json      what the job runs: the frozen config, the run directory, the command line, and
                                    the steps' argv and prompts hash the job checks its own plan against
    <run>.slurm/jobs.json           the job id, its state and log (as the pipeline's slurm/jobs.json)
    <run>.slurm/slurm-<id>.out      the job's output: the supervisor's lines

Resources come from the plan's benchmark step as the pipeline's come from a stage's (`execute.plan.step_resources`): a
GPU benchmark ("all GPUs") takes a whole node (exclusive, all its memory) with N GPUs, N the GPUs the benchmark
uses (vLLM's tensor_parallel_size, else 1); a CPU benchmark one CPU. The job's time limit is the plan's limits
summed (the benchmark step's `--max-seconds`; the fetch step has no limit of its own and counts when the pinned
snapshots are already in the hub cache, where it only checks them) plus MARGIN_S for the supervisor's start-up and
its final record, in whole minutes: the supervisor's own limit fires first and records `timed_out` itself. A
snapshot still to be downloaded inside the job leaves the time to the partition's default.

Following: the launcher's (every POLL_INTERVAL_S, sooner once the run's manifest is final), the run's records
printed as they land; Ctrl-C or SIGTERM cancels the job, and the supervisor in the job, stopped by the scheduler's
SIGTERM, records the run as `interrupted` (or `timed_out` at the scheduler's time limit). The outcome is the run's
own final status; the job id and end state are added to the manifest's notes. A job that ended while the run
recorded no end (a lost node, the scheduler's SIGKILL) is reported with the scheduler's state and `invoke recover
RUN`, which is never run automatically: the submitting host (a login node) can neither see the node's processes
nor remove the containers a job leaves on its node.

`python -m draftscope.bench.batch run-benchmark --job <run>.slurm/benchmark.json` is what the job script runs
(`run_benchmark`); `cleanup-benchmark --job …` removes the benchmark's containers at once (its SIGTERM trap).

Over ~400 lines on purpose: the submitting side and the in-job side share the job's file layout and its frozen
config, and change together.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.bench.plan import Plan, plan_benchmark
from draftscope.bench.progress import Progress
from draftscope.bench.supervisor import context_for, preflight
from draftscope.bench.supervisor import dry_run_lines as local_dry_run_lines
from draftscope.bench.supervisor import run_benchmark as supervise
from draftscope.core import settings
from draftscope.core.config import build as build_config
from draftscope.core.config import to_dict
from draftscope.core.errors import UserError
from draftscope.core.hub import fetch_argv, hub_cache_dir, hub_snapshot
from draftscope.core.jsonio import atomic_write_json, read_json, read_submitted
from draftscope.core.presets import ExperimentConfig
from draftscope.core.provenance import now
from draftscope.core.rundir import FINAL, RECORDS, RunDir, check_run_name, liveness, slurm_folder_of
from draftscope.execute import registry
from draftscope.execute.base import LEDGER_FILE, POLL_INTERVAL_S, Ended, Printer, TaskEnd
from draftscope.execute.injob import here, main_guard, remove_container, say
from draftscope.execute.plan import Fields, InJob, Job, JobChain, Placement, display, step_resources
from draftscope.runtime import Context, get_runtime
from draftscope.runtime.base import container_name, tail

MODULE = "draftscope.bench.batch"  # what the job script runs: `python -m MODULE run-benchmark`
JOB_FILE = "benchmark.json"
LOG_FILE = "slurm-%j.out"
# The scheduler's limit = the plan's limits + this, in whole minutes: the kit's start-up on the node (imports,
# preflight, the image facts, the fetch step's check of cached snapshots) and the final record (summary, validation).
MARGIN_S = 120.0
# Tests only: the job's time limit in seconds (whole minutes, rounded up) instead of the plan's limits + MARGIN_S,
# so that the scheduler's limit can come before the supervisor's own.
TEST_TIME_ENV = settings.DRAFTSCOPE_TEST_JOB_TIME_S.name
FINAL_POLL_S = 1.0  # once the run's manifest is final, the job ends within seconds: ask this often
SCHEMA_VERSION = 1
KEY = "benchmark"  # the job's key in jobs.json and the scheduler's messages


@dataclass(frozen=True)
class BenchmarkJob:
    """One benchmark's job: the plan, where things go, and the job (resources, name, what it runs)."""

    plan: Plan
    output: Path  # the run directory, absolute
    cwd: Path  # the job's working directory: the submitting one, so relative paths resolve as they did there
    runtime: str
    python: str  # the interpreter the job runs the kit with (the submitting one: shared storage)
    job: Job
    time_basis: str  # how --time was set, in words

    @property
    def chain(self) -> JobChain:
        return JobChain(runtime=self.runtime, python=self.python, jobs=(self.job,))

    @property
    def folder(self) -> Path:
        return slurm_folder_of(self.output)

    @property
    def script(self) -> Path:
        return self.job.script

    @property
    def job_file(self) -> Path:
        return self.folder / JOB_FILE

    @property
    def ledger(self) -> Path:
        return self.folder / LEDGER_FILE

    def log(self, job_id: str = "%j") -> Path:
        return self.folder / LOG_FILE.replace("%j", job_id)


def gpus_used(plan: Plan) -> int:
    """The GPUs a benchmark on "all GPUs" uses: vLLM's tensor-parallel size, else one (Transformers)."""
    experiment = plan.experiment
    return plan.backend.gpus_per_task(experiment)


def snapshots_cached(plan: Plan) -> bool:
    return all(
        d.revision is not None and Path(hub_snapshot(d.destination, d.repo, d.revision)).is_dir()
        for d in plan.downloads
    )


def time_limit(plan: Plan) -> tuple[float | None, float, str]:
    """(seconds, margin, in words) for the job's time limit: the plan's limits summed, or None (the partition's
    default)."""
    forced = settings.DRAFTSCOPE_TEST_JOB_TIME_S.get()
    if forced:
        return float(forced), 0.0, f"{forced} s from {TEST_TIME_ENV} (tests only), in whole minutes"
    unbounded = [s.name for s in plan.steps if s.max_seconds is None]
    if unbounded and not (unbounded == ["fetch"] and snapshots_cached(plan)):
        fetch = fetch_argv(str(hub_cache_dir()), [(d.repo, d.revision) for d in plan.downloads])
        return (
            None,
            MARGIN_S,
            (
                f"the partition's default: step(s) {', '.join(unbounded)} have no time limit (the pinned snapshots are "
                "not in the hub cache yet, so the job downloads them); for a limit of --max-seconds + "
                f"{MARGIN_S:g} s, download them first on a host with network: {display(fetch)}"
            ),
        )
    total = sum(s.max_seconds or 0.0 for s in plan.steps)
    limits = " + ".join(f"{s.name} {s.max_seconds:g} s" for s in plan.steps if s.max_seconds is not None)
    cached = " (fetch: cached snapshots, checked only)" if unbounded else ""
    return (
        total,
        MARGIN_S,
        (f"{limits}{cached} + {MARGIN_S:g} s for the kit's start-up and the final record, in whole minutes"),
    )


def build(
    config: ExperimentConfig, output: Path, *, flags: Mapping[str, Any], python: str, cwd: Path | None = None
) -> BenchmarkJob:
    """The job of one benchmark. Pure: nothing is written, no scheduler command runs."""
    output = Path(output).absolute()
    cwd = Path(cwd or Path.cwd()).absolute()
    plan = plan_benchmark(config, str(output))
    step = next(s for s in plan.steps if s.name == "benchmark")
    seconds, margin, basis = time_limit(plan)
    opts = Placement(partition=flags.get("partition"), account=flags.get("account"), qos=flags.get("qos"))
    res = step_resources(step, opts, all_gpus=gpus_used(plan), seconds=seconds, margin=margin)
    folder = slurm_folder_of(output)
    job_file = folder / JOB_FILE
    runtime = get_runtime(config.runtime)
    ctx = context_for(output)
    where = "in this node's Python environment" if config.runtime == "local" else "each in its image"
    about = [
        f"draftscope benchmark {output}: experiment {plan.experiment.name}, backend {plan.experiment.backend}, "
        f"preset {plan.preset.name}, device {plan.experiment.device}",
        "the kit's supervisor runs here as in a local run (`invoke benchmark ... --executor local`), with the config "
        f"frozen in {job_file}: it creates {output} and runs the steps through the {config.runtime} runtime, "
        f"{where}:",
        *(f"  {s.name}: {display(runtime.argv(s, ctx))}" for s in plan.steps),
        f"--time: {basis}" if res.minutes else f"no --time: {basis}",
    ]
    if res.gpus:
        about.append(
            f"GPUs: {res.gpus} (the benchmark's), on a node of its own (--exclusive: no job beside it)"
        )
    job = Job(
        key=KEY,
        stage=KEY,
        kind=KEY,
        name=f"ds-{output.name}-{KEY}",
        resources=res,
        run=InJob(
            module=MODULE,
            command="run-benchmark",
            args=("--job", str(job_file)),
            cleanup="cleanup-benchmark" if config.runtime != "local" else None,
        ),
        script=folder / here().script_name(KEY),
        log=folder / LOG_FILE,
        chdir=cwd,
        about=tuple(about),
        fields=fields(res.gpus),
    )
    return BenchmarkJob(plan, output, cwd, config.runtime, python, job, basis)


def render(bj: BenchmarkJob) -> str:
    """The job as submitted: the launcher's script (resources, SIGTERM trap) around `run-benchmark`."""
    return registry.batch(here().name).job_text(bj.chain, bj.job)


def dry_run_lines(bj: BenchmarkJob) -> list[str]:
    """The job script and the submission line, exactly as a submission writes and runs them. No file, no
    scheduler command."""
    return registry.batch(here().name).dry_run_lines(BenchmarkWork(bj))


def document(bj: BenchmarkJob, argv: Sequence[str]) -> dict[str, Any]:
    """`benchmark.json`: what the job's supervisor runs. `argv` (the submitting command line) becomes the run's
    command line, as a local run records its own."""
    plan = bj.plan
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KEY,
        "output": str(bj.output),
        "cwd": str(bj.cwd),
        "runtime": bj.runtime,
        "python": bj.python,
        "host": socket.gethostname(),
        "argv": list(argv),
        "config": to_dict(plan.experiment),
        "prompts_sha256": plan.prompts.sha256,
        "steps": [{"name": s.name, "argv": list(s.argv)} for s in plan.steps],
        "written_at": now(),
    }


@dataclass(frozen=True)
class Loaded:
    doc: dict[str, Any]
    config: ExperimentConfig
    plan: Plan
    output: Path


def load(path: Path) -> Loaded:
    """On the node: the submitted benchmark, planned again by this node's kit and checked against the submission
    (another kit, or prompts changed since, would make the run claim what was not submitted)."""
    doc = read_submitted(
        path, what="benchmark job", folder="run's folder", schema_version=SCHEMA_VERSION, kind=KEY
    )
    config = build_config(ExperimentConfig, doc["config"])
    output = Path(doc["output"])
    plan = plan_benchmark(config, str(output))
    if plan.prompts.sha256 != doc["prompts_sha256"]:
        raise UserError(
            f"the prompt file {plan.prompts.path} differs from the one submitted (SHA-256)",
            source=str(path),
            fix="keep the prompts unchanged on storage every node sees until the job has started; resubmit",
        )
    if [{"name": s.name, "argv": list(s.argv)} for s in plan.steps] != doc["steps"]:
        raise UserError(
            "the kit on this node plans other steps for this benchmark than the submitting host did",
            source=str(path),
            fix="run the same draftscope (shared storage, same version) on the login and compute nodes",
        )
    return Loaded(doc, config, plan, output)


# --- the submitting side ----------------------------------------------------------------------------------------


def refuse_taken(bj: BenchmarkJob) -> None:
    """The run directory and its `.slurm` folder must not exist (runs are never overwritten or merged)."""
    check_run_name(bj.output)
    for path in (bj.output, bj.folder):
        if os.path.lexists(path):
            raise UserError(
                "the output directory already exists; runs are never overwritten or merged"
                if path == bj.output
                else f"{path.name} (the Slurm job's folder for this run directory) already exists",
                field="--output",
                value=str(path),
                fix="choose a new --output path" + ("" if path == bj.output else f", or remove {path}"),
            )


def fields(gpus: int) -> Fields:
    """What a refusal of the job names: the benchmark's flags, not a config's fields."""
    need = f"{gpus} GPU(s): --device cuda, vLLM's tensor_parallel_size" if gpus else "one CPU"
    return {"resources": ("--partition", need), "time": ("--max-seconds", ", or a smaller --max-seconds")}


@dataclass(frozen=True)
class BenchmarkWork:
    """One benchmark for a launcher: run here (`run_here`), or as one batch job (the `execute.base.Batch` hooks)."""

    bj: BenchmarkJob

    # the local launcher

    def run_here(self, *, argv: list[str], say: Printer) -> tuple[str, str | None]:
        manifest = supervise(self.bj.plan.experiment, self.bj.output, argv=argv, say=say)
        return manifest["status"], manifest.get("reason")

    def dry_run_here(self) -> list[str]:
        return local_dry_run_lines(self.bj.plan, get_runtime(self.bj.runtime), self.bj.output)

    # a batch launcher

    @property
    def folder(self) -> Path:
        return self.bj.folder

    @property
    def ledger(self) -> Path:
        return self.bj.ledger

    @property
    def resume(self) -> str:
        return f"the job runs on and records the run itself (invoke validate {self.bj.output})"

    order = None  # one job, which nothing waits for

    def preflight(self) -> None:
        refuse_taken(self.bj)
        # The images and GPUs are on the nodes, not on the submitting host (a login node): the job checks them there.
        preflight(self.bj.plan, get_runtime(self.bj.runtime), here=False)

    def jobs(self, say: Printer) -> JobChain:
        return self.bj.chain

    def dry_run(self, executor: str) -> tuple[list[str], JobChain]:
        bj, plan = self.bj, self.bj.plan
        heading = [
            f"# draftscope benchmark: experiment {plan.experiment.name}, runtime {bj.runtime}, executor {executor}, "
            f"run directory {bj.output} (created by the supervisor in the job)",
            f"# 1 job; its script and {JOB_FILE} (the frozen config it runs) go to {bj.folder}/, its output to "
            f"{bj.log('<job id>')}",
            *(f"# note: {n}" for n in plan.notes),
        ]
        return heading, bj.chain

    def write(self, chain: JobChain, argv: list[str]) -> None:
        """The job's folder, created exclusively (of two submissions to one run directory, one goes on), and the
        frozen benchmark it runs."""
        bj = self.bj
        bj.folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(bj.folder)
        except FileExistsError:
            refuse_taken(bj)
            raise
        try:
            atomic_write_json(bj.job_file, document(bj, argv))
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        shutil.rmtree(
            self.bj.folder, ignore_errors=True
        )  # created by this submission, which submitted nothing

    def announce(self, submitted: Sequence[Ended]) -> str:
        (s,) = submitted
        return f"{here().name}: submitted job {s.job_id} ({s.job.name}); its output: {s.log}; the run: {self.bj.output}"

    def poll(self) -> float:
        return FINAL_POLL_S if _run_status(self.bj.output) in FINAL else POLL_INTERVAL_S

    @contextlib.contextmanager
    def following(self, say: Printer) -> Iterator[None]:
        """The run's records, printed as they land."""
        plan = self.bj.plan
        progress = Progress(self.bj.output / RECORDS, plan.prompts.count * plan.experiment.repeats, say)
        progress.start()
        try:
            yield
        finally:
            progress.stop()

    def outcome(self, submitted: Sequence[Ended], say: Printer) -> tuple[str, str | None]:
        return conclude(self.bj, submitted[0], say)


def run(
    config: ExperimentConfig,
    output: Path,
    *,
    flags: Mapping[str, Any],
    argv: list[str],
    say: Printer = print,
    executor: str = "slurm",
) -> tuple[str, str | None]:
    """Submit one benchmark, follow its job, and return the run's (status, reason)."""
    launcher = registry.get(executor)
    launcher.ready()
    bj = build(config, output, flags=flags, python=sys.executable)
    return launcher.launch(BenchmarkWork(bj), argv=argv, say=say)


def _run_status(output: Path) -> str | None:
    try:
        return read_json(output / "manifest.json").get("status")
    except Exception:
        return None


def conclude(bj: BenchmarkJob, s: Ended, say: Printer) -> tuple[str, str | None]:
    """The run's final status once its job has ended, with the job noted in its manifest; the scheduler's account
    of the job when the run recorded no end (or was never created)."""
    record = s.records[-1] if s.records else None
    slurm_said = s.reason or (f"job {s.job_id} ended {record.state}" if record else f"job {s.job_id} ended")
    if not (bj.output / "manifest.json").is_file():
        detail = tail(s.log, lines=1)
        status = s.status if s.status not in (None, "completed") else "failed"
        return status, f"{slurm_said} before the run directory was created" + (
            f": {detail}" if detail else ""
        )
    run = RunDir.open(bj.output)
    status = run.manifest()["status"]
    state = liveness(bj.output, status)
    if state.state != "live":  # nobody else writes the manifest now
        try:
            run.note(job_note(s, record))
        except (OSError, UserError) as exc:
            say(f"warning: the {here().title} job could not be noted in the run's manifest: {exc}")
    manifest = run.manifest()
    if status in FINAL:
        return status, manifest.get("reason")
    if state.state == "live":
        return status, (
            f"{slurm_said}, but {state.describe()}: it is still writing the run's end; look again with "
            f"`invoke validate {bj.output}`"
        )
    host = state.info.get("host")
    where = f" on {host}, where its step ran" if host and host != socket.gethostname() else ""
    return status, (
        f"{slurm_said}, and the run recorded no end (its supervisor was killed with the job); finish its record "
        f"with `invoke recover {bj.output}`{where}"
    )


def job_note(s: Ended, record: TaskEnd | None) -> str:
    """The manifest note: the job, its end state (exit code, nodes) and its log."""
    if record is not None:
        details = [f"exit code {record.exit_code}"] if record.exit_code else []
        if record.reason and record.reason not in ("None",):
            details.append(f"reason {record.reason}")
        if record.nodes and record.nodes != "(null)":
            details.append(f"on {record.nodes}")
        ended = f"ended {record.state}" + (f" ({', '.join(details)})" if details else "")
    else:
        ended = f"ended: {s.reason}"
    return f"{here().name}: job {s.job_id} ({s.job.name}) {ended}; submitted from {socket.gethostname()}; output {s.log}"


# --- inside the job: `python -m draftscope.bench.batch` ----------------------------------------------------------


def run_benchmark(job_file: Path, *, say: Printer = say) -> int:
    """The benchmark's supervisor, as a local run's, with the submitted config (`benchmark.json`); a stop by the
    scheduler (a cancellation, the time limit) is recorded as it explains it. Exit 0 only for a completed run."""
    loaded = load(job_file)
    node = here()
    note = (
        f"supervised in {node.title} job {node.job_id() or 'none'} on {node.nodes() or socket.gethostname()} "
        f"(invoke benchmark --executor {node.name}, submitted from {loaded.doc.get('host')})"
    )
    manifest = supervise(
        loaded.config,
        loaded.output,
        argv=list(loaded.doc["argv"]),
        say=say,
        notes=[note],
        explain=node.explain_stop,
        grace_seconds=node.stop_grace(),
    )
    reason = manifest.get("reason")
    say(f"{loaded.output}: {manifest['status']}" + (f" ({reason})" if reason else ""))
    return 0 if manifest["status"] == "completed" else 1


def cleanup_benchmark(job_file: Path) -> int:
    """Remove the benchmark's containers at once (the job script's SIGTERM trap), by the names the runtime gives
    them: cancelling the job ends the engine's client, not its container."""
    try:
        doc = read_json(job_file)
    except Exception:
        return 0  # nothing to go by; the supervisor stops its own container too
    engine, output = doc.get("runtime"), Path(doc.get("output") or ".")
    ctx = Context(run_dir=output, run_id=output.name)
    for step in doc.get("steps") or ():
        remove_container(engine, container_name(ctx, step["name"]))
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="what a benchmark's Slurm job script runs on its node"
    )
    sub = root.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run-benchmark", "run a benchmark's supervisor with the submitted config"),
        ("cleanup-benchmark", "remove the benchmark's containers (SIGTERM trap)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--job", required=True, type=Path, help="the run's <run>.slurm/benchmark.json")
    return root


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 for a completed run, 1 when not, 2 for a user error, 143 when stopped before anything
    could be recorded."""
    args = parser().parse_args(argv)
    if args.command == "run-benchmark":
        return main_guard(lambda: run_benchmark(args.job))
    return main_guard(lambda: cleanup_benchmark(args.job))


if __name__ == "__main__":
    sys.exit(main())
