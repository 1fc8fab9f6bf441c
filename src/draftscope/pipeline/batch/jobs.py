"""Which batch jobs a pipeline plan becomes (a chain of `execute.plan.Job`s the launcher renders and submits), and
the stage → job decisions the host and the jobs share. Pure: nothing is written and nothing is run here, so the dry
run prints exactly what a submission writes and submits.

One job per stage, in stage order, each waiting for the one before to end successfully:
- `step`: the stage's Step, resources from it (GPUs per node; "all GPUs" as the whole node: the config's `gpus`,
  exclusive, all its memory), the time limit from the stage's.
- `shards` (regen, hsextract): a job array, one task per shard of the rows (regen: row k → shard k mod N;
  hsextract: speculators' contiguous blocks by world size and rank), each on its own node, then one job that runs
  however the array ended (to record how) and writes the stage record: regen's `merge` checks every row is
  accounted for and merges the shards' files into the stage's outputs; hsextract's `check` runs the whole-output
  check in the stage's image (every row has its file; the tasks wrote into the shared folder).
- `torchrun` (train on GPUs): one task per node; each runs the step with torchrun's `--standalone` replaced by a
  c10d rendezvous at the allocation's first node.

Inside every job the kit runs the stage (`python -m draftscope.pipeline.batch run-step`) through the same runtime as
a local run (docker, podman or local), so the in-container argv is the local run's (shards add their shard options,
training its rendezvous), and each job writes the stage record a local run writes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from draftscope.core.errors import UserError
from draftscope.execute import registry
from draftscope.execute.injob import here
from draftscope.execute.plan import (
    Fields,
    InJob,
    Job,
    JobChain,
    Placement,
    Resources,
    display,
    step_resources,
)
from draftscope.pipeline import state
from draftscope.pipeline.batch import layout
from draftscope.pipeline.batch.shards import check_step
from draftscope.pipeline.config import PipelineConfig, SlurmStageOptions
from draftscope.pipeline.plan import PipelinePlan, StagePlan, fetch_step
from draftscope.runtime import Context, Runtime
from draftscope.runtime.step import Step

MODULE = "draftscope.pipeline.batch"  # what the job scripts run: `python -m MODULE COMMAND`
MERGE_MINUTES = 30  # a merge job reads and writes regen's rows once; a check job lists the files once
# The stages that run as a job array, and the job that follows the array: (key suffix, kind).
ARRAY_STAGES = {"regen": ("merge", "merge"), "hsextract": ("check", "check")}
ORDER = "each job waits for the one before; a failed dependency cancels the rest"  # the dry run's words


@dataclass(frozen=True)
class JobPlan(JobChain):
    """The jobs of one pipeline submission (a chain the launcher submits), and the plan they came from."""

    plan: PipelinePlan

    @property
    def folder(self) -> Path:
        return layout.folder(self.plan.workdir)

    @property
    def plan_file(self) -> Path:
        return self.folder / layout.PLAN_FILE


# --- the stage → job decisions, shared by the host (submission, skip checks) and the jobs ---------------------


def kind_of(sp: StagePlan) -> str:
    if sp.stage.name in ARRAY_STAGES:
        return "shards"
    if sp.stage.name == "train" and _torchrun_at(sp.step.argv) is not None:
        return "torchrun"
    return "step"


def stage_options(config: PipelineConfig, stage: str) -> SlurmStageOptions:
    """The stage's batch-job settings (`slurm.stages.<stage>`): its own overrides over the top-level ones."""
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
    """The multi-node step as the record and the dry run show it: the per-job values as the launcher's placeholders
    (each node fills them in), so the record's command — and the skip check built on it — does not change per
    job."""
    nnodes, node_rank, job_id, head = here().SPREAD
    argv = torchrun_argv(
        step.argv, nnodes=nnodes, node_rank=node_rank, endpoint=f"{head}:{port}", rdzv_id=job_id
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


def skip_reason(workdir: Path, sp: StagePlan, runtime: Runtime) -> str | None:
    """Why the stage's record lets it be skipped, computed as `runner.run_stage` does (argv, commands, image
    reference, inputs, outputs), without asking the container engine: the host that submits may have none."""
    ctx = Context(run_dir=workdir, run_id=workdir.name)
    reference = runtime.image_reference(sp.step.image)
    config_hash = state.config_sha256(
        runtime.argv(sp.step, ctx), [c.to_dict() for c in sp.commands], reference
    )
    return state.skip_reason(
        state.read_record(workdir, sp.stage.name),
        config_hash=config_hash,
        inputs=state.fingerprints(sp.inputs),
        outputs=sp.outputs,
    )


# --- resources ------------------------------------------------------------------------------------------------


def placement(opts: SlurmStageOptions) -> Placement:
    return Placement(
        partition=opts.partition,
        account=opts.account,
        qos=opts.qos,
        time_limit_s=opts.time_limit_s,
        cpus_per_task=opts.cpus_per_task,
        mem=opts.mem,
    )


def resources(sp: StagePlan, config: PipelineConfig) -> Resources:
    opts = stage_options(config, sp.stage.name)
    return step_resources(
        sp.step,
        placement(opts),
        all_gpus=config.gpus,
        seconds=sp.step.max_seconds,
        nodes=(opts.nodes or 1) if kind_of(sp) == "torchrun" else 1,
    )


def fields(key: str) -> Fields:
    """The config fields a refusal of the job names: its stage's `slurm.stages` entry."""
    return {
        "resources": (f"slurm.stages.{key}", "GPUs: the config's gpus; CPUs, mem, nodes"),
        "time": (f"slurm.stages.{key}.time_limit_s", ""),
    }


# --- the jobs of a plan ---------------------------------------------------------------------------------------


def build(
    plan: PipelinePlan, runtime: Runtime, *, python: str, start: int = 0, fetch: bool = False
) -> JobPlan:
    """The jobs for `plan.stages[start:]` (earlier stages are complete), after a `fetch` job when the target's
    snapshot is missing."""
    config = plan.config
    ctx = Context(run_dir=plan.workdir, run_id=plan.workdir.name)
    jobs: list[Job] = []
    previous: tuple[str, ...] = ()
    job = functools.partial(_job, plan, runtime)
    if fetch and (step := fetch_step(plan)) is not None:
        top = stage_options(config, "fetch")
        about = (
            "download the pinned target snapshot into the hub cache (needs network)",
            f"the only step given credentials, by name (values never recorded): {', '.join(step.credentials)}",
            f"runs through the {runtime.name} runtime:",
            "  " + display(runtime.argv(step, ctx)),
        )
        fetched_by = Resources(cpus_per_task=1, partition=top.partition, account=top.account, qos=top.qos)
        jobs.append(job("fetch", "fetch", "fetch", fetched_by, about=about))
        previous = ("fetch",)
    for sp in plan.stages[start:]:
        name, kind = sp.stage.name, kind_of(sp)
        res = resources(sp, config)
        opts = stage_options(config, name)
        if kind == "shards":
            shards = opts.shards or 1
            about = _describe(sp, runtime, ctx, config, kind, shards=shards)
            jobs.append(job(name, name, "shards", res, array_size=shards, after_ok=previous, about=about))
            suffix, after = ARRAY_STAGES[name]
            merge_res = Resources(
                cpus_per_task=1,
                minutes=MERGE_MINUTES,
                partition=res.partition,
                account=res.account,
                qos=res.qos,
            )
            if after == "merge":
                about = (
                    f"account for every row of the {shards} shard(s) (ok + errors == input), merge their files "
                    f"into {name}/ and write stages/{name}.json",
                )
            else:
                check = check_step(sp, plan.context)
                about = (
                    f"check that the {shards} task(s) completed, then every row has its "
                    f"hidden_states/hs_<row>.safetensors (sampled shapes); write {name}/summary.json and "
                    f"stages/{name}.json, or record the stage failed naming the failed tasks or missing rows:",
                    "  " + display(runtime.argv(check, ctx)),
                )
            jobs.append(job(f"{name}.{suffix}", name, after, merge_res, after_any=(name,), about=about))
            previous = (f"{name}.{suffix}",)
            continue
        if kind == "step" and name == "train" and (opts.nodes or 1) > 1:
            raise UserError(
                "this train step runs in one process (the CPU path) and cannot span nodes",
                field="slurm.stages.train.nodes" if config.slurm.stages.get("train") else "--nodes",
                value=opts.nodes,
                fix="train on one node (--nodes 1), or on GPUs (device: cuda) for torchrun across nodes",
            )
        about = _describe(sp, runtime, ctx, config, kind, nodes=res.nodes)
        jobs.append(job(name, name, kind, res, after_ok=previous, about=about))
        previous = (name,)
    return JobPlan(runtime=runtime.name, python=python, jobs=tuple(jobs), plan=plan)


def _job(
    plan: PipelinePlan,
    runtime: Runtime,
    key: str,
    stage: str,
    kind: str,
    res: Resources,
    *,
    array_size: int = 0,
    after_ok: tuple[str, ...] = (),
    after_any: tuple[str, ...] = (),
    about: tuple[str, ...] = (),
) -> Job:
    """One job of the chain: the kit's `run-step` (`merge`, `check`) for its stage, with a SIGTERM trap that
    removes the step's container before the job ends (cancelling the job alone leaves it running); training across
    nodes as one task per node, node 0 as the rendezvous."""
    workdir = plan.workdir
    container = runtime.name != "local" and kind != "merge"  # the merge runs in the kit, not in an image
    run = InJob(
        module=MODULE,
        command=kind if kind in ("merge", "check") else "run-step",
        args=("--plan", str(layout.folder(workdir) / layout.PLAN_FILE), "--stage", stage),
        task_flag="--shard",
        cleanup=("cleanup --check" if kind == "check" else "cleanup") if container else None,
        rendezvous=("--rdzv-endpoint", plan.config.slurm.rdzv_port) if kind == "torchrun" else None,
    )
    return Job(
        key=key,
        stage=stage,
        kind=kind,
        name=f"ds-{workdir.name}-{key}",
        resources=res,
        run=run,
        script=layout.script_path(workdir, key),
        log=layout.log_path(workdir, key, array=array_size > 0),
        chdir=workdir,
        array_size=array_size,
        after_ok=after_ok,
        after_any=after_any,
        about=(f"draftscope pipeline {workdir}: job {key}", *about),
        fields=fields(key),
    )


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


# --- the dry run ------------------------------------------------------------------------------------------------


def heading(jp: JobPlan, skipped: Sequence[tuple[str, str]] = (), executor: str = "slurm") -> list[str]:
    """The dry run's first lines: what is submitted, where its files go, the plan's notes, the stages skipped."""
    plan = jp.plan
    lines = [
        f"# draftscope pipeline: draft {plan.config.draft}, preset {plan.preset.name}, runtime {jp.runtime}, "
        f"executor {executor}, workdir {plan.workdir}",
        f"# config: {plan.source}",
        f"# {len(jp.jobs)} job(s); the job scripts and {jp.plan_file.name} go to {jp.folder}/, the jobs' output "
        f"to {plan.workdir / layout.LOGS_DIR}/",
    ]
    lines += [f"# note: {n}" for n in plan.notes]
    lines += [f"# {stage}: skipped ({why})" for stage, why in skipped]
    return lines


def dry_run_lines(jp: JobPlan, skipped: Sequence[tuple[str, str]] = ()) -> list[str]:
    """Every job script, then the submission lines in order, each with its dependency."""
    launcher = registry.batch(here().name)
    return launcher.chain_lines(heading(jp, skipped, launcher.name), jp, ORDER)
