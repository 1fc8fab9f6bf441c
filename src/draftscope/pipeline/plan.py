"""Planning: a run config + the selected stages → one `Step` per stage, plus the processes each starts.

Pure: nothing is written, nothing heavy is imported. `--dry-run` prints this plan through the runtime's own
`argv`, so the printed container command is exactly the one a real run executes.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from draftscope.core import images
from draftscope.core.errors import UserError
from draftscope.core.hub import hub_cache_dir, hub_snapshot
from draftscope.core.presets import ModelPreset
from draftscope.core.provenance import shell_join
from draftscope.core.resources import resolve_path
from draftscope.pipeline import registry
from draftscope.pipeline.base import (
    DRAFT_MODEL_MOUNT,
    INPUTS_MOUNT,
    Artifact,
    Command,
    Layout,
    Stage,
    StageContext,
    model_mounts_and_paths,
    offline_env,
    run_mount,
    served_context_length,
)
from draftscope.pipeline.config import PipelineConfig, Resolved
from draftscope.runtime import Context
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT, Mount, Step, limits_for
from draftscope.runtime.step import fetch_step as runtime_fetch_step

CHAT_MOUNT = f"{INPUTS_MOUNT}/chat.jsonl"
PROMPTS_MOUNT = f"{INPUTS_MOUNT}/prompts.json"


@dataclass(frozen=True)
class StagePlan:
    stage: Stage
    step: Step
    commands: tuple[Command, ...]
    inputs: tuple[Artifact, ...]
    outputs: tuple[Artifact, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class PipelinePlan:
    config: PipelineConfig
    preset: ModelPreset
    source: str
    workdir: Path
    runtime: str
    context: StageContext
    stages: tuple[StagePlan, ...]
    notes: tuple[str, ...]


def default_workdir(config: PipelineConfig) -> Path:
    return Path("runs") / f"pipeline-{config.name}"


def external_inputs(config: PipelineConfig) -> dict[str, Path]:
    """The files a run reads from outside the workdir, resolved on the host (a relative path is taken from the
    current directory, else from the kit's checkout)."""
    found: dict[str, Path] = {}
    if config.data.chat:
        found["chat"] = resolve_path(config.data.chat).absolute()
    found["prompts"] = resolve_path(config.bench.prompts).absolute()
    if config.serve.draft_model:
        found["draft_model"] = resolve_path(config.serve.draft_model).absolute()
    return found


def context(resolved: Resolved, workdir: Path, runtime: str, selected: Sequence[Stage]) -> StageContext:
    config, preset = resolved.config, resolved.preset
    local = runtime == "local"
    workdir = Path(workdir).absolute()
    model_mounts, model, tokenizer = model_mounts_and_paths(config, preset, local)
    inputs = external_inputs(config)
    mounts: list[Mount] = [run_mount(workdir), *model_mounts]
    if "chat" in inputs:
        mounts.append(Mount(str(inputs["chat"]), CHAT_MOUNT))
    mounts.append(Mount(str(inputs["prompts"]), PROMPTS_MOUNT))
    if "draft_model" in inputs:
        mounts.append(Mount(str(inputs["draft_model"]), DRAFT_MODEL_MOUNT))
    layout = Layout(
        run=str(workdir) if local else RUN_MOUNT,
        model=model,
        tokenizer=tokenizer,
        chat=str(inputs.get("chat", "<data.chat>")) if local else CHAT_MOUNT,
        prompts=str(inputs["prompts"]) if local else PROMPTS_MOUNT,
    )
    return StageContext(
        config=config,
        preset=preset,
        workdir=workdir,
        runtime=runtime,
        layout=layout,
        mounts=tuple(mounts),
        inputs=MappingProxyType(inputs),
        selected=frozenset(s.name for s in selected),
    )


def stage_step(stage: Stage, ctx: StageContext) -> Step:
    env = offline_env()
    if not any(m.target == CACHE_MOUNT for m in ctx.mounts):
        env.pop("HF_HUB_CACHE")
    env.update(stage.env(ctx))
    gpu = stage.uses_gpu and not ctx.cpu
    return Step(
        name=stage.name,
        image=stage.cpu_image if ctx.cpu and stage.cpu_image else stage.image,
        argv=tuple(stage.argv(ctx)),
        mounts=ctx.mounts,
        env=MappingProxyType(env),
        gpus=-1 if gpu else 0,
        ipc_host=gpu,  # NCCL / vLLM / SGLang worker processes share memory through /dev/shm
        network=False,  # weights are local; servers listen on the container's own loopback (no credential)
        # A GPU pipeline's CPU stages (pretokenize, prepare) handle the full data set: the host-scale limits.
        limits=limits_for(ctx.config.container, gpus=0 if ctx.cpu else -1),
        max_seconds=ctx.config.time_limits.get(stage.name),
        outputs=tuple(str(a.path.relative_to(ctx.workdir)) for a in stage.outputs(ctx)),
        output_schema=stage.output_schema,
    )


def fetch_step(plan: PipelinePlan) -> Step | None:
    """The step that downloads the pinned target snapshot (network on, the hub credentials by name, the hub cache
    writable), for a preset that loads its target from the hub; None otherwise. It runs first, and only when the
    hub cache lacks the snapshot (`fetch_needed`); the dry run shows it either way."""
    preset, config = plan.preset, plan.config
    if preset.hub is None or config.model_path is not None or preset.hub.revision is None:
        return None
    return runtime_fetch_step(
        [(preset.hub.repo, preset.hub.revision)], str(hub_cache_dir()), config.container
    )


def fetch_needed(plan: PipelinePlan) -> bool:
    """Whether the hub cache lacks the pinned snapshot that `fetch_step` downloads."""
    hub = plan.preset.hub
    if hub is None or hub.revision is None:
        return False
    return not Path(hub_snapshot(str(hub_cache_dir()), hub.repo, hub.revision)).is_dir()


def check_stage_names(config: PipelineConfig) -> None:
    """Options keyed by a stage name (time limits, Slurm overrides) name a registered stage. The schemas admit any
    name, so that the registry alone says which stages exist; this refuses a misspelt one, naming the field."""
    known = [s.name for s in registry.STAGES]
    keyed = [("time_limits", name) for name in config.time_limits]
    keyed += [("slurm.stages", name) for name in config.slurm.stages]
    for where, name in keyed:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(
                f"unknown stage '{name}'",
                field=f"{where}.{name}",
                fix=f"{hint}use one of: {', '.join(known)}",
            )


def build(resolved: Resolved, stages: Sequence[Stage], workdir: Path, runtime: str) -> PipelinePlan:
    check_stage_names(resolved.config)
    ctx = context(resolved, workdir, runtime, stages)
    plans = tuple(
        StagePlan(
            stage=s,
            step=stage_step(s, ctx),
            commands=tuple(s.commands(ctx)),
            inputs=tuple(s.inputs(ctx)),
            outputs=tuple(s.outputs(ctx)),
            notes=tuple(s.notes(ctx)),
        )
        for s in stages
    )
    return PipelinePlan(
        resolved.config,
        resolved.preset,
        resolved.source,
        ctx.workdir,
        runtime,
        ctx,
        plans,
        tuple(plan_notes(ctx)),
    )


def plan_notes(ctx: StageContext) -> list[str]:
    config, preset = ctx.config, ctx.preset
    notes = []
    if preset.hub is not None and config.model_path is None:
        notes.append(f"target {preset.hub.display()}, loaded from its pinned snapshot in the hub cache")
        if not preset.hub.pinned:
            notes.append("the target has no pinned revision: a real run refuses it")
    elif config.model_path is not None:
        notes.append(f"target from model_path {config.model_path}")
    else:
        notes.append("target: the kit-built tiny model (draftscope/assets/tiny)")
    if preset.architecture.is_hybrid:
        notes.append(
            "hybrid (GDN) target: vLLM runs with custom all-reduce off and the mp executor (docs/develop/integration-bugs.md, bug 1)"
        )
    if preset.dflash.mask_token_id is None:
        notes.append(
            "the preset names no mask token id: speculators resolves one from the tokenizer, convert copies it"
        )
    if not preset.status.tested:
        notes.append(f"preset '{preset.name}' is untested end to end: {preset.status.notes}".rstrip(": "))
    if "chat" not in ctx.inputs:
        notes.append("data.chat is not set: a real run of regen or pretokenize refuses to start")
    if window_note := sliding_window_note(ctx):
        notes.append(window_note)
    return notes


def sliding_window_note(ctx: StageContext) -> str | None:
    """Said before training, what convert's mask probe refuses after it: speculators' sliding window counts W
    context tokens back from the anchor, SGLang's W - 1 keys back from each query, so the served masks equal the
    trained ones only up to a context of W - B + 1 (convert/probe.py, docs/develop/integration-bugs.md bug 4)."""
    window, block = ctx.config.train.sliding_window, ctx.preset.dflash.block_size
    served = served_context_length(ctx)
    limit = window - block + 1
    if served <= limit:
        return None
    return (
        f"convert's mask probe will refuse this draft: served context {served} > {limit} (train.sliding_window "
        f"{window} - block size {block} + 1), where SGLang's sliding window parts from the trained one; train with "
        f"train.sliding_window >= {served + block - 1} or serve with serve.context_length <= {limit}"
    )


def dry_run_lines(plan: PipelinePlan, runtime) -> list[str]:
    """Per stage: the image reference, the exact container command, and the processes that command starts."""
    ctx = Context(run_dir=plan.workdir, run_id=plan.workdir.name)
    preset = plan.preset
    lines = [
        f"# draftscope pipeline: draft {plan.config.draft}, preset {preset.name} ({preset.display_name}, "
        f"{preset.architecture.kind}), runtime {runtime.name}, workdir {plan.workdir}",
        f"# config: {plan.source}",
    ]
    lines += [f"# note: {n}" for n in plan.notes]
    fetch = fetch_step(plan)
    if fetch is not None:
        when = "runs first" if fetch_needed(plan) else "skipped: the snapshot is in the hub cache"
        lines.append("")
        lines.append(f"# [fetch] the pinned target snapshot ({when}); network on, the hub cache writable")
        lines.append(f"#   image {fetch.image}: {images.image_reference(fetch.image)}")
        lines.append(f"#   credentials by name (values never recorded): {', '.join(fetch.credentials)}")
        lines.append(
            f"#   proxy and mirror by name (values never recorded): {', '.join(fetch.env_passthrough)}"
        )
        lines.append(shell_join(runtime.argv(fetch, ctx)))
    total = len(plan.stages)
    for i, sp in enumerate(plan.stages, start=1):
        reference = images.image_reference(sp.step.image)
        lines.append("")
        lines.append(f"# [{i}/{total}] {sp.stage.name}: {sp.stage.summary}")
        lines.append(f"#   image {sp.step.image}: {reference}")
        lines.append(shell_join(runtime.argv(sp.step, ctx)))
        for command in sp.commands:
            lines.append(f"#   {command.name}: {command.display()}")
        lines += [f"#   note: {n}" for n in sp.notes]
    return lines
