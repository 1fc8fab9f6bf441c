"""`invoke benchmark --executor slurm`: one benchmark as one Slurm batch job, through the same plan.

Inside the job the kit's supervisor runs on the compute node as a local run's would (`python -m draftscope.execute.slurm
run-benchmark`, the submitting host's Python: `supervisor.run_benchmark` with the config frozen at submission),
so the run directory, its manifest, records, time limit (`--max-seconds`) and container runtime are a local
run's. The submitting side only submits, follows and reports.

Files (the run directory itself must not exist before the supervisor creates it exclusively, so the job's files
sit next to it, in `<run>.slurm/`, created exclusively at submission):

    <run>.slurm/benchmark.sbatch   the job script
    <run>.slurm/benchmark.json     what the job runs: the frozen config, the run directory, the command line, and
                                   the steps' argv and prompts hash the job checks its own plan against
    <run>.slurm/jobs.json          the job id, its Slurm state and log (as the pipeline's slurm/jobs.json)
    <run>.slurm/slurm-<id>.out     the job's output: the supervisor's lines

Resources come from the plan's benchmark step as the pipeline's come from a stage's (`jobs.step_resources`): a
GPU benchmark ("all GPUs") takes a whole node (`--exclusive`, `--mem=0`) with `--gres=gpu:N`, N the GPUs the
benchmark uses (vLLM's tensor_parallel_size, else 1); a CPU benchmark one CPU. The job's `--time` is the plan's
limits summed (the benchmark step's `--max-seconds`; the fetch step has no limit of its own and counts when the
pinned snapshots are already in the hub cache, where it only checks them) plus MARGIN_S for the supervisor's
start-up and its final record, in whole minutes: the supervisor's own limit fires first and records `timed_out`
itself. A snapshot still to be downloaded inside the job leaves the time to the partition's default.

Following: `executor.follow` (scontrol every slurm.poll_interval_s, sooner once the run's manifest is final),
the run's records printed as they land; Ctrl-C or SIGTERM cancels the job (scancel), and the supervisor in the
job, stopped by Slurm's SIGTERM, records the run as `interrupted` (or `timed_out` at Slurm's time limit). The
outcome is the run's own final status; the Slurm job id and end state are added to the manifest's notes. A job
that ended while the run recorded no end (NODE_FAIL, SIGKILL after KillWait) is reported with Slurm's state and
`invoke recover RUN`, which is never run automatically: the submitting host (a login node) can neither see the
node's processes nor remove the containers a job leaves on its node.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftscope.bench.plan import Plan, plan_benchmark
from draftscope.core.errors import UserError
from draftscope.core.hub import fetch_argv, hub_cache_dir
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.presets import ExperimentConfig
from draftscope.core.provenance import now
from draftscope.core.rundir import SLURM_SUFFIX, slurm_folder_of
from draftscope.execute.slurm import client, jobs

if TYPE_CHECKING:
    from draftscope.execute.slurm.executor import Submitted
    from draftscope.execute.slurm.states import JobState

Printer = Callable[[str], None]
SUFFIX = SLURM_SUFFIX
SCRIPT_FILE = "benchmark.sbatch"
JOB_FILE = "benchmark.json"
LOG_FILE = "slurm-%j.out"
# Slurm's limit = the plan's limits + this, in whole minutes: the kit's start-up on the node (imports, preflight,
# the image facts, the fetch step's check of cached snapshots) and the final record (summary, validation).
MARGIN_S = 120.0
# Tests only: the job's --time in seconds (whole minutes, rounded up) instead of the plan's limits + MARGIN_S, so
# that Slurm's limit can come before the supervisor's own.
TEST_TIME_ENV = "DRAFTSCOPE_TEST_SLURM_JOB_TIME_S"
FINAL_POLL_S = 1.0  # once the run's manifest is final, the job ends within seconds: ask Slurm this often
SCHEMA_VERSION = 1
KEY = "benchmark"  # the job's key in jobs.json and Slurm's messages


@dataclass(frozen=True)
class BenchmarkJob:
    """One benchmark's job: the plan, where things go, and the job (resources, name, what it runs)."""

    plan: Plan
    output: Path  # the run directory, absolute
    cwd: Path  # the job's working directory: the submitting one, so relative paths resolve as they did there
    runtime: str
    python: str  # the interpreter the job runs the kit with (the submitting one: shared storage)
    job: jobs.Job
    time_basis: str  # how --time was set, in words

    @property
    def folder(self) -> Path:
        return slurm_folder_of(self.output)

    @property
    def script(self) -> Path:
        return self.folder / SCRIPT_FILE

    @property
    def job_file(self) -> Path:
        return self.folder / JOB_FILE

    @property
    def ledger(self) -> Path:
        return self.folder / jobs.JOBS_FILE

    def log(self, job_id: str = "%j") -> Path:
        return self.folder / LOG_FILE.replace("%j", job_id)


def gpus_used(plan: Plan) -> int:
    """The GPUs a benchmark on "all GPUs" uses: vLLM's tensor-parallel size, else one (Transformers)."""
    experiment = plan.experiment
    return plan.backend.gpus_per_task(experiment)


def snapshots_cached(plan: Plan) -> bool:
    from draftscope.core.hub import hub_snapshot

    return all(
        d.revision is not None and Path(hub_snapshot(d.destination, d.repo, d.revision)).is_dir()
        for d in plan.downloads
    )


def time_limit(plan: Plan) -> tuple[float | None, float, str]:
    """(seconds, margin, in words) for the job's --time: the plan's limits summed, or None (partition default)."""
    forced = os.environ.get(TEST_TIME_ENV)
    if forced:
        return float(forced), 0.0, f"{forced} s from {TEST_TIME_ENV} (tests only), in whole minutes"
    unbounded = [s.name for s in plan.steps if s.time_limit_s is None]
    if unbounded and not (unbounded == ["fetch"] and snapshots_cached(plan)):
        fetch = fetch_argv(str(hub_cache_dir()), [(d.repo, d.revision) for d in plan.downloads])
        return (
            None,
            MARGIN_S,
            (
                f"the partition's default: step(s) {', '.join(unbounded)} have no time limit (the pinned snapshots are "
                "not in the hub cache yet, so the job downloads them); for a limit of --max-seconds + "
                f"{MARGIN_S:g} s, download them first on a host with network: {jobs.display(fetch)}"
            ),
        )
    total = sum(s.time_limit_s or 0.0 for s in plan.steps)
    limits = " + ".join(f"{s.name} {s.time_limit_s:g} s" for s in plan.steps if s.time_limit_s is not None)
    cached = " (fetch: cached snapshots, checked only)" if unbounded else ""
    return (
        total,
        MARGIN_S,
        (f"{limits}{cached} + {MARGIN_S:g} s for the kit's start-up and the final record, in whole minutes"),
    )


def build(
    config: ExperimentConfig, output: Path, *, flags: Mapping[str, Any], python: str, cwd: Path | None = None
) -> BenchmarkJob:
    """The job of one benchmark. Pure: nothing is written, no Slurm command runs."""
    from draftscope.pipeline.config import SlurmStageOptions

    output = Path(output).absolute()
    plan = plan_benchmark(config, str(output))
    step = next(s for s in plan.steps if s.name == "benchmark")
    seconds, margin, basis = time_limit(plan)
    opts = SlurmStageOptions(
        partition=flags.get("partition"), account=flags.get("account"), qos=flags.get("qos")
    )
    res = jobs.step_resources(step, opts, all_gpus=gpus_used(plan), seconds=seconds, margin=margin)
    name = f"ds-{output.name}-{KEY}"
    job = jobs.Job(KEY, KEY, KEY, name, res, about=())
    return BenchmarkJob(plan, output, Path(cwd or Path.cwd()).absolute(), config.runtime, python, job, basis)


def render(bj: BenchmarkJob) -> str:
    """The job script: the pipeline's #SBATCH lines and SIGTERM trap (`jobs`), around `run-benchmark`."""
    from draftscope.bench.supervisor import context_for
    from draftscope.runtime import get_runtime

    q = shlex.quote
    plan, res = bj.plan, bj.job.resources
    runtime = get_runtime(bj.runtime)
    ctx = context_for(bj.output)
    where = "in this node's Python environment" if bj.runtime == "local" else "each in its image"
    about = [
        f"# draftscope benchmark {bj.output}: experiment {plan.experiment.name}, backend {plan.experiment.backend}, "
        f"preset {plan.preset.name}, device {plan.experiment.device}",
        "# the kit's supervisor runs here as in a local run (`invoke benchmark ... --executor local`), with the config "
        f"frozen in {bj.job_file}: it creates {bj.output} and runs the steps through the {bj.runtime} runtime, "
        f"{where}:",
        *(f"#   {s.name}: {jobs.display(runtime.argv(s, ctx))}" for s in plan.steps),
        f"# --time: {bj.time_basis}" if res.minutes else f"# no --time: {bj.time_basis}",
    ]
    if res.gpus:
        about.append(
            f"# GPUs: {res.gpus} (the benchmark's), on a node of its own (--exclusive: no job beside it)"
        )
    head = jobs.sbatch_header(bj.job.name, bj.log(), bj.cwd, res)
    args = f"--job {q(str(bj.job_file))}"
    launch = ['"${kit[@]}" run-benchmark "${args[@]}" &']
    cleanup = "cleanup-benchmark" if bj.runtime != "local" else None
    return "\n".join([*head, "#", *about, *jobs.job_body(bj.python, args, launch, cleanup=cleanup)]) + "\n"


def dry_run_lines(bj: BenchmarkJob) -> list[str]:
    """The job script and the sbatch line, exactly as a submission writes and runs them. No file, no Slurm."""
    plan = bj.plan
    lines = [
        f"# draftscope benchmark: experiment {plan.experiment.name}, runtime {bj.runtime}, executor slurm, "
        f"run directory {bj.output} (created by the supervisor in the job)",
        f"# 1 job; its script and {JOB_FILE} (the frozen config it runs) go to {bj.folder}/, its output to "
        f"{bj.log('<job id>')}",
        *(f"# note: {n}" for n in plan.notes),
        "",
        f"# ===== {bj.script}",
        *render(bj).rstrip("\n").splitlines(),
        "",
        "# ===== submission",
        jobs.display(client.submit_argv(bj.script, None)),
    ]
    return lines


def document(bj: BenchmarkJob, argv: Sequence[str]) -> dict[str, Any]:
    """`benchmark.json`: what the job's supervisor runs. `argv` (the submitting command line) becomes the run's
    command line, as a local run records its own."""
    from draftscope.core.config import to_dict

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
    from draftscope.core.config import build as build_config

    try:
        doc = read_json(path)
    except Exception as exc:
        raise UserError(
            f"cannot read the submitted benchmark ({exc})",
            source=str(path),
            fix="the run's folder must be on storage every node sees; resubmit",
        ) from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION or doc.get("kind") != KEY:
        raise UserError("not a benchmark job file of this kit version", source=str(path), fix="resubmit")
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
    from draftscope.core.rundir import check_run_name

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


def fields(bj: BenchmarkJob) -> client.Fields:
    need = (
        f"{bj.job.resources.gpus} GPU(s): --device cuda, vLLM's tensor_parallel_size"
        if bj.job.resources.gpus
        else "one CPU"
    )
    return {"resources": ("--partition", need), "time": ("--max-seconds", ", or a smaller --max-seconds")}


def run(
    config: ExperimentConfig, output: Path, *, flags: Mapping[str, Any], argv: list[str], say: Printer = print
) -> tuple[str, str | None]:
    """Submit one benchmark, follow its job, and return the run's (status, reason)."""
    from draftscope.bench.supervisor import preflight
    from draftscope.runtime import get_runtime
    from draftscope.runtime.base import sigterm_interrupts

    client.require("sbatch")
    bj = build(config, output, flags=flags, python=sys.executable)
    refuse_taken(bj)
    # The images and GPUs are on the nodes, not on the submitting host (a login node): the job checks them there.
    preflight(bj.plan, get_runtime(config.runtime), here=False)
    script = render(bj)
    res = bj.job.resources
    slurm = {"partition": res.partition, "account": res.account, "qos": res.qos}
    client.test_only(script, job=KEY, fields=fields(bj), **slurm)
    bj.folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(bj.folder)  # exclusive: of two submissions to one run directory, one goes on
    except FileExistsError:
        refuse_taken(bj)
        raise
    try:
        atomic_write_json(bj.job_file, document(bj, argv))
        bj.script.write_text(script, encoding="utf-8")
        bj.script.chmod(0o755)
    except BaseException:
        shutil.rmtree(bj.folder, ignore_errors=True)  # created by this submission, which submitted nothing
        raise
    with sigterm_interrupts():  # SIGTERM, like Ctrl-C, cancels the job (executor.follow)
        return _submit_and_follow(bj, argv, slurm, say)


def _submit_and_follow(
    bj: BenchmarkJob, argv: list[str], slurm: dict[str, Any], say: Printer
) -> tuple[str, str | None]:
    from draftscope.bench.supervisor import Progress
    from draftscope.core.rundir import FINAL, RECORDS
    from draftscope.execute.slurm import executor
    from draftscope.pipeline.config import SlurmOptions

    try:
        job_id = client.submit(bj.script, dependency=None, job=KEY, fields=fields(bj), **slurm)
    except BaseException:
        shutil.rmtree(bj.folder, ignore_errors=True)  # created by this submission, which submitted nothing
        raise
    submitted = [executor.Submitted(bj.job, job_id, None, bj.log(job_id))]
    ledger = executor.Ledger(bj.folder, bj.ledger)
    total = bj.plan.prompts.count * bj.plan.experiment.repeats
    progress = Progress(bj.output / RECORDS, total, say)
    every = SlurmOptions().poll_interval_s

    def poll() -> float:
        return FINAL_POLL_S if _run_status(bj.output) in FINAL else every

    try:
        ledger.add(submitted, argv, runtime=bj.runtime, python=bj.python)
        say(
            f"slurm: submitted job {job_id} ({bj.job.name}); its output: {bj.log(job_id)}; the run: {bj.output}"
        )
        progress.start()
    except BaseException:  # stopped before following began: the job goes too
        client.cancel([job_id])
        raise
    try:
        executor.follow(
            submitted,
            ledger,
            poll=poll,
            say=say,
            resume=f"the job runs on and records the run itself (invoke validate {bj.output})",
        )
    finally:
        progress.stop()
    return conclude(bj, submitted[0], say)


def _run_status(output: Path) -> str | None:
    try:
        return read_json(output / "manifest.json").get("status")
    except Exception:
        return None


def conclude(bj: BenchmarkJob, s: Submitted, say: Printer) -> tuple[str, str | None]:
    """The run's final status once its job has ended, with the job noted in its manifest; Slurm's account of the
    job when the run recorded no end (or was never created)."""
    from draftscope.core.rundir import FINAL, RunDir, liveness
    from draftscope.runtime.base import tail

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
            say(f"warning: the Slurm job could not be noted in the run's manifest: {exc}")
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


def job_note(s: Submitted, record: JobState | None) -> str:
    """The manifest note: the Slurm job, its end state (exit code, nodes) and its log."""
    if record is not None:
        details = [f"exit code {record.exit_code}"] if record.exit_code else []
        if record.reason and record.reason not in ("None",):
            details.append(f"reason {record.reason}")
        if record.nodes and record.nodes != "(null)":
            details.append(f"on {record.nodes}")
        ended = f"ended {record.state}" + (f" ({', '.join(details)})" if details else "")
    else:
        ended = f"ended: {s.reason}"
    return (
        f"slurm: job {s.job_id} ({s.job.name}) {ended}; submitted from {socket.gethostname()}; output {s.log}"
    )
