"""Planning Slurm jobs from a pipeline plan, and rendering their job scripts and `sbatch` lines. Pure: nothing is
written and nothing is run here, so the dry run prints exactly what a submission writes and submits.

One job per stage, in stage order, each depending on the one before (`--dependency=afterok:<id>`):
- `step`: the stage's Step, resources from it (GPUs as `--gres=gpu:N`; "all GPUs" as the whole node: the
  config's `gpus`, `--exclusive`, `--mem=0`), the time limit from the stage's.
- `shards` (regen, hsextract): a job array, one task per shard of the rows (regen: row k → shard k mod N;
  hsextract: speculators' contiguous blocks by world size and rank), each on its own node, then one job `afterany` (it runs
  even when a shard failed, to record how) that writes the stage record: regen's `merge` checks every row is
  accounted for and merges the shards' files into the stage's outputs; hsextract's `check` runs the whole-output
  check in the stage's image (every row has its file; the tasks wrote into the shared folder).
- `torchrun` (train on GPUs): `srun` starts one task per node; each runs the step with torchrun's `--standalone`
  replaced by a c10d rendezvous at the allocation's first node.

Inside every job the kit runs the stage (`python -m draftscope.execute.slurm run-step`) through the same runtime as a
local run (docker, podman or local), so the in-container argv is the local run's (shards add their shard options,
training its rendezvous), and each job writes the stage record a local run writes.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from draftscope.core.errors import UserError
from draftscope.pipeline.config import PipelineConfig, SlurmStageOptions
from draftscope.pipeline.plan import PipelinePlan, StagePlan
from draftscope.runtime import Context, Runtime
from draftscope.runtime.step import Step

SLURM_DIR = "slurm"
PLAN_FILE = "plan.json"
JOBS_FILE = "jobs.json"
LOGS_DIR = "logs"
# The runtime stops a step at the stage's own time limit and records `timed_out` itself; Slurm's limit comes a
# minute later (whole minutes, rounded up) as the backstop for a job that cannot stop.
TIME_MARGIN_S = 60.0
MERGE_MINUTES = 30  # a merge job reads and writes regen's rows once; a check job lists the files once
# The stages that run as a job array, and the job that follows the array: (key suffix, kind).
ARRAY_STAGES = {"regen": ("merge", "merge"), "hsextract": ("check", "check")}
# Placeholders in the torchrun line of a multi-node job, filled in on each node (see `torchrun_argv`).
NNODES, NODE_RANK, JOB_ID, HEAD = "$SLURM_NNODES", "$SLURM_NODEID", "$SLURM_JOB_ID", "$head_node"


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
class Job:
    key: str  # file and variable names: "regen", "regen.merge", "train", "fetch"
    stage: str  # a stage name, or "fetch"
    kind: str  # step | shards | merge | check | torchrun | fetch
    name: str  # --job-name
    resources: Resources
    shards: int = 0  # array tasks (kind shards; 0 otherwise)
    after_ok: tuple[str, ...] = ()  # keys of the jobs this one waits for, successfully ended
    after_any: tuple[str, ...] = ()  # keys of the jobs this one waits for, however they ended
    about: tuple[str, ...] = ()  # comment lines: what the job runs

    @property
    def array(self) -> str | None:
        return f"0-{self.shards - 1}" if self.kind == "shards" else None


@dataclass(frozen=True)
class JobPlan:
    """The jobs of one submission and where their files go."""

    plan: PipelinePlan
    runtime: str
    python: str  # the interpreter each job runs the kit with (the submitting one: shared storage)
    jobs: tuple[Job, ...]

    @property
    def folder(self) -> Path:
        return self.plan.workdir / SLURM_DIR

    @property
    def plan_file(self) -> Path:
        return self.folder / PLAN_FILE

    def script(self, job: Job) -> Path:
        return self.folder / f"{job.key}.sbatch"

    def log(self, job: Job) -> Path:
        return self.plan.workdir / LOGS_DIR / f"slurm-{job.key}-{'%A_%a' if job.array else '%j'}.out"

    def job(self, key: str) -> Job:
        return next(j for j in self.jobs if j.key == key)


# --- the stage → job decisions, shared by the host (submission, skip checks) and the jobs ---------------------


def kind_of(sp: StagePlan) -> str:
    if sp.stage.name in ARRAY_STAGES:
        return "shards"
    if sp.stage.name == "train" and _torchrun_at(sp.step.argv) is not None:
        return "torchrun"
    return "step"


def stage_options(config: PipelineConfig, stage: str) -> SlurmStageOptions:
    """The stage's Slurm settings: its own overrides over the top-level ones."""
    top = config.slurm
    own = config.slurm.stages.get(stage) or SlurmStageOptions()
    return SlurmStageOptions(
        partition=own.partition or top.partition,
        account=own.account or top.account,
        qos=own.qos or top.qos,
        nodes=own.nodes or top.nodes,
        shards=own.shards or top.nodes,
        time_limit_s=own.time_limit_s,
        cpus_per_task=own.cpus_per_task or top.cpus_per_task,
        mem=own.mem or top.mem,
    )


def _torchrun_at(argv: Sequence[str]) -> int | None:
    """Index of `torchrun` when it is followed by `--standalone` (the single-node launch the plan builds)."""
    for i, word in enumerate(argv[:-1]):
        if word == "torchrun" and argv[i + 1] == "--standalone":
            return i
    return None


def torchrun_argv(
    argv: Sequence[str], *, nnodes: str, node_rank: str, endpoint: str, rdzv_id: str
) -> tuple[str, ...]:
    """The step's argv with torchrun's `--standalone` replaced by a c10d rendezvous across the allocation."""
    i = _torchrun_at(argv)
    if i is None:
        raise UserError(
            "the train step has no 'torchrun --standalone' to spread over nodes",
            field="--stage",
            value="train",
            fix="train on one node (slurm.stages.train.nodes: 1)",
        )
    rdzv = [
        "--nnodes",
        nnodes,
        "--node-rank",
        node_rank,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
    ]
    return (*argv[: i + 1], *rdzv, *argv[i + 2 :])


def torchrun_template(step: Step, port: int) -> Step:
    """The multi-node step as the record and the dry run show it: the per-job values as placeholders (each node
    fills them in), so the record's command — and the skip check built on it — does not change per job."""
    argv = torchrun_argv(
        step.argv, nnodes=NNODES, node_rank=NODE_RANK, endpoint=f"{HEAD}:{port}", rdzv_id=JOB_ID
    )
    return replace(step, argv=argv)


def record_step(sp: StagePlan, runtime: Runtime, config: PipelineConfig) -> tuple[StagePlan, Runtime]:
    """What a stage's record says ran, and through which runtime: the step itself, or for training across nodes
    the rendezvous template through the host-network runtime. The host's skip check and the job's record use
    this one function, so they agree."""
    if kind_of(sp) != "torchrun":
        return sp, runtime
    template = torchrun_template(sp.step, config.slurm.rdzv_port)
    return replace(sp, step=template), runtime.with_host_network()


# --- resources ------------------------------------------------------------------------------------------------


def minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


def slurm_time(total_minutes: int) -> str:
    """`--time` as D-HH:MM:SS (Slurm counts whole minutes)."""
    days, rest = divmod(total_minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00"


def resources(sp: StagePlan, config: PipelineConfig) -> Resources:
    opts = stage_options(config, sp.stage.name)
    return step_resources(
        sp.step,
        opts,
        all_gpus=config.gpus,
        seconds=sp.step.time_limit_s,
        nodes=(opts.nodes or 1) if kind_of(sp) == "torchrun" else 1,
    )


def step_resources(
    step: Step,
    opts: SlurmStageOptions,
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


# --- the jobs of a plan ---------------------------------------------------------------------------------------


def build(
    plan: PipelinePlan, runtime: Runtime, *, python: str, start: int = 0, fetch: bool = False
) -> JobPlan:
    """The jobs for `plan.stages[start:]` (earlier stages are complete), after a `fetch` job when the target's
    snapshot is missing."""
    config = plan.config
    ctx = Context(run_dir=plan.workdir, run_id=plan.workdir.name)
    prefix = f"ds-{plan.workdir.name}"
    jobs: list[Job] = []
    previous: tuple[str, ...] = ()
    if fetch:
        top = stage_options(config, "fetch")
        jobs.append(
            Job(
                "fetch",
                "fetch",
                "fetch",
                f"{prefix}-fetch",
                Resources(cpus_per_task=1, partition=top.partition, account=top.account, qos=top.qos),
                about=("download the pinned target snapshot into the hub cache (needs network)",),
            )
        )
        previous = ("fetch",)
    for sp in plan.stages[start:]:
        name, kind = sp.stage.name, kind_of(sp)
        res = resources(sp, config)
        opts = stage_options(config, name)
        if kind == "shards":
            shards = opts.shards or 1
            jobs.append(
                Job(
                    name,
                    name,
                    "shards",
                    f"{prefix}-{name}",
                    res,
                    shards=shards,
                    after_ok=previous,
                    about=_describe(sp, runtime, ctx, config, kind, shards=shards),
                )
            )
            suffix, after = ARRAY_STAGES[name]
            merge_res = Resources(
                cpus_per_task=1,
                minutes=MERGE_MINUTES,
                partition=res.partition,
                account=res.account,
                qos=res.qos,
            )
            if after == "merge":
                about: tuple[str, ...] = (
                    f"account for every row of the {shards} shard(s) (ok + errors == input), merge their files "
                    f"into {name}/ and write stages/{name}.json",
                )
            else:
                from draftscope.execute.slurm.shards import check_step

                check = check_step(sp, plan.context)
                about = (
                    f"check that the {shards} task(s) completed, then every row has its "
                    f"hidden_states/hs_<row>.safetensors (sampled shapes); write {name}/summary.json and "
                    f"stages/{name}.json, or record the stage failed naming the failed tasks or missing rows:",
                    "  " + display(runtime.argv(check, ctx)),
                )
            jobs.append(
                Job(
                    f"{name}.{suffix}",
                    name,
                    after,
                    f"{prefix}-{name}.{suffix}",
                    merge_res,
                    after_any=(name,),
                    about=about,
                )
            )
            previous = (f"{name}.{suffix}",)
            continue
        if kind == "step" and name == "train" and (opts.nodes or 1) > 1:
            raise UserError(
                "this train step runs in one process (the CPU path) and cannot span nodes",
                field="slurm.stages.train.nodes" if config.slurm.stages.get("train") else "--nodes",
                value=opts.nodes,
                fix="train on one node (--nodes 1), or on GPUs (device: cuda) for torchrun across nodes",
            )
        jobs.append(
            Job(
                name,
                name,
                kind,
                f"{prefix}-{name}",
                res,
                after_ok=previous,
                about=_describe(sp, runtime, ctx, config, kind, nodes=res.nodes),
            )
        )
        previous = (name,)
    return JobPlan(plan, runtime.name, python, tuple(jobs))


def _describe(
    sp: StagePlan,
    runtime: Runtime,
    ctx: Context,
    config: PipelineConfig,
    kind: str,
    *,
    shards: int = 0,
    nodes: int = 1,
) -> tuple[str, ...]:
    name = sp.stage.name
    where = (
        "this node's Python environment"
        if runtime.name == "local"
        else f"{runtime.name}, image {sp.step.image}"
    )
    lines = [f"stage {name}: {sp.stage.summary}", f"runs through the {runtime.name} runtime ({where}):"]
    if kind == "torchrun":
        template, rt = record_step(sp, runtime, config)
        lines.append(f"each of the {nodes} node(s) runs, with the first node as the rendezvous:")
        lines.append("  " + display(rt.argv(template.step, ctx)))
        return tuple(lines)
    lines.append("  " + display(runtime.argv(sp.step, ctx)))
    if kind == "shards" and name == "hsextract":
        servers = sum(1 for c in sp.commands if c.port is not None)
        if servers:
            lines.append(
                f"array task I of {shards} runs it on its clients' blocks of the rows: they get --world-size "
                f"{shards}*{servers} --rank I*{servers}+i, its servers ports + I*{servers} and scratch "
                f"{name}/shards/I/scratch-i; it writes into hidden_states/ with its own --commands, --result, "
                f"--logs and --summary ({name}/shards/I/summary.json)"
            )
        else:
            lines.append(
                f"array task I of {shards} runs it on block I of {shards} of the rows (--world-size {shards} "
                f"--rank I), writing into hidden_states/ with its own --result and --summary "
                f"({name}/shards/I/summary.json)"
            )
    elif kind == "shards":
        servers = sum(1 for c in sp.commands if c.port is not None)
        lines.append(
            f"array task I of {shards} runs it on rows k with k mod {shards} == I (--shard I --shards {shards}), "
            f"into {name}/shards/I/, with its own --commands, --result and --logs and server ports + I*{servers}"
        )
    for command in sp.commands:
        lines.append(f"  {command.name}: {command.display()}")
    return tuple(lines)


# A word made of safe characters and `$name` references: printed unquoted, so that the shell expands them.
_WITH_VARIABLES = re.compile(r"[\w\-=:.,/]*(\$[A-Za-z_]\w*[\w\-=:.,/]*)+")


def display(argv: Sequence[str]) -> str:
    """An argv as shell words: quoted, except the `$name` placeholders a job (or the dry run's script) fills in."""
    return " ".join(a if _WITH_VARIABLES.fullmatch(a) else shlex.quote(a) for a in argv)


# --- rendering --------------------------------------------------------------------------------------------------


def render(jp: JobPlan, job: Job) -> str:
    """The job script: #SBATCH lines, what it runs (comments), then the kit's `run-step` (`merge`, `check`) with a
    SIGTERM trap that removes the step's container before the job ends (scancel alone leaves it running)."""
    res = job.resources
    workdir = jp.plan.workdir
    q = shlex.quote
    head = sbatch_header(job.name, jp.log(job), workdir, res, array=job.array)
    about = [f"# draftscope pipeline {workdir}: job {job.key}", *(f"# {line}" for line in job.about)]
    args = f"--plan {q(str(jp.plan_file))} --stage {q(job.stage)}"
    if job.array:
        args += ' --shard "$SLURM_ARRAY_TASK_ID"'
    command = job.kind if job.kind in ("merge", "check") else "run-step"
    container = jp.runtime != "local" and job.kind != "merge"
    cleanup = "cleanup --check" if job.kind == "check" else "cleanup"
    if job.kind == "torchrun":
        port = jp.plan.config.slurm.rdzv_port
        gres = f" --gres=gpu:{res.gpus}" if res.gpus else ""
        launch = [
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1{gres} --kill-on-bad-exit=1 \\',
            f'  "${{kit[@]}}" {command} "${{args[@]}}" --rdzv-endpoint "$head_node:{port}" &',
        ]
    else:
        launch = [f'"${{kit[@]}}" {command} "${{args[@]}}" &']
    body = job_body(jp.python, args, launch, cleanup=cleanup if container else None)
    return "\n".join([*head, "#", *about, *body]) + "\n"


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


def job_body(python: str, args: str, launch: Sequence[str], *, cleanup: str | None) -> list[str]:
    """The script's commands: the kit (`python -m draftscope.execute.slurm`, the submitting host's interpreter) started
    in the background by `launch` with `args`, and a SIGTERM trap that runs the kit's `cleanup` command (when the
    step runs in a container) and waits for the kit to record how the step ended."""
    q = shlex.quote
    body = [
        "set -u",
        f"kit=({q(python)} -m draftscope.execute.slurm)",
        f"args=({args})",
        'child=""',
        "# Slurm sends SIGTERM to every process of the job (scancel, time limit), then SIGKILL after KillWait.",
        "on_term() {",
    ]
    if cleanup:
        body.append(
            f'  "${{kit[@]}}" {cleanup} "${{args[@]}}"  # the container outlives its client otherwise'
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


def dependency(job: Job, ids: dict[str, str]) -> str | None:
    """`afterok:<id>[:<id>…]` (and `afterany:` for a merge or check), from the ids of the jobs it waits for."""
    parts = []
    if job.after_ok:
        parts.append("afterok:" + ":".join(ids[k] for k in job.after_ok))
    if job.after_any:
        parts.append("afterany:" + ":".join(ids[k] for k in job.after_any))
    return ",".join(parts) or None


def variable(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", key)


def dry_run_lines(jp: JobPlan, skipped: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Every job script, then the sbatch lines in submission order, each with its dependency."""
    from draftscope.execute.slurm import client

    plan = jp.plan
    lines = [
        f"# draftscope pipeline: draft {plan.config.draft}, preset {plan.preset.name}, runtime {jp.runtime}, "
        f"executor slurm, workdir {plan.workdir}",
        f"# config: {plan.source}",
        f"# {len(jp.jobs)} job(s); the job scripts and {jp.plan_file.name} go to {jp.folder}/, the jobs' output "
        f"to {plan.workdir / LOGS_DIR}/",
    ]
    lines += [f"# note: {n}" for n in plan.notes]
    lines += [f"# {stage}: skipped ({why})" for stage, why in skipped]
    for job in jp.jobs:
        lines += ["", f"# ===== {jp.script(job)}", *render(jp, job).rstrip("\n").splitlines()]
    lines += [
        "",
        "# ===== submission (each job waits for the one before; a failed dependency cancels the rest)",
    ]
    placeholders = {j.key: f"${variable(j.key)}" for j in jp.jobs}
    for job in jp.jobs:
        argv = client.submit_argv(jp.script(job), dependency(job, placeholders))
        lines.append(f"{variable(job.key)}=$({display(argv)})")  # as `submit` runs it, with ids as variables
    return lines
