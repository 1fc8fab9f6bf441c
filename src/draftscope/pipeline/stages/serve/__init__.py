"""serve: SGLang instances serving the target with the converted draft, one per GPU mask.

Each instance: `python -m sglang.launch_server` on its own GPUs (`CUDA_VISIBLE_DEVICES`), `--tp-size` equal to its
mask size, its own port, `--enable-metrics`, no radix (prefix) cache, and the speculative flags for the draft type:
DFlash and DFlash2 drafts run under `DFLASH` with `--speculative-num-draft-tokens` = the block size (DFlash2
checkpoints are dispatched on their architecture), DSpark under `DSPARK` with `--speculative-dspark-block-size` =
gamma (the drafted tokens per step, see convert). The plan is validated before anything starts: TP equals the
mask size, no GPU is shared, every GPU exists, ports are distinct and free.

The stage starts the instances, waits for each to report healthy, sends one greedy request each, writes
`serve/plan.json` (schema `stage-serve`) and stops them (`--hold` keeps them up until interrupted). The bench stage
starts the same instances itself.

`serve.draft=model` serves the preset's draft model instead (the tiny preset's), under `STANDALONE` with
`serve.draft_steps` drafted tokens a step. On a CPU (`device: cpu`) the stage runs SGLang's CPU engine in the
sglang-cpu image (`pipeline/sglang_cpu.py`: `--device cpu`, one instance, no GPU). SGLang refuses DFLASH there and
serves a draft only on a CPU with AMX, so a CPU run serves `serve.draft=model`, and both refusals are made in the
preflight, before any stage starts, each naming its fix.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path, PurePosixPath

from draftscope.core.errors import UserError
from draftscope.pipeline import sglang_cpu
from draftscope.pipeline.base import (
    DRAFT_MODEL_MOUNT,
    Artifact,
    Command,
    Entry,
    Stage,
    StageContext,
    host_model_paths,
    kit_argv,
    model_artifacts,
    resolve_instances,
    served_context_length,
    tiny_assets,
)
from draftscope.pipeline.stages.convert.checkpoint import dspark_gamma
from draftscope.pipeline.stages.serve import runner

NAME = "serve"
CPU_IMAGE = "sglang-cpu"


def instances(ctx: StageContext):
    return resolve_instances(ctx, ctx.config.serve.instances, ctx.config.serve.base_port, "serve")


def serves_model(ctx: StageContext) -> bool:
    """The preset's draft model (STANDALONE), not the converted draft."""
    return ctx.config.serve.draft == "model"


def algorithm(ctx: StageContext) -> str:
    if serves_model(ctx):
        return sglang_cpu.STANDALONE
    return "DSPARK" if ctx.config.draft == "dspark" else "DFLASH"


def draft_kind(ctx: StageContext) -> str:
    """What bench records as the served draft: `model`, or the trained draft's architecture."""
    return "model" if serves_model(ctx) else ctx.config.draft


def draft_tokens(ctx: StageContext) -> int:
    """Tokens per verification window: the block for DFLASH; gamma (drafted tokens) for DSPARK; the drafted tokens
    and the target's own for STANDALONE."""
    if serves_model(ctx):
        return ctx.config.serve.draft_steps + 1
    block = ctx.preset.dflash.block_size
    if ctx.config.draft == "dspark":
        return dspark_gamma(block, ctx.config.train.dspark.sample_from_anchor)
    return block


def draft_path(ctx: StageContext) -> str:
    """The served draft's folder as the stage sees it: convert's output, or the draft model (serve.draft_model, else
    the kit's tiny draft beside the target in the mounted assets)."""
    if serves_model(ctx) and "draft_model" in ctx.inputs:
        return str(ctx.inputs["draft_model"]) if ctx.local else DRAFT_MODEL_MOUNT
    if serves_model(ctx):
        return str(PurePosixPath(ctx.layout.tokenizer) / "draft")
    return ctx.layout.at("draft")


def draft_model_folder(ctx: StageContext) -> Path:
    """The draft model's folder on the host (serve.draft=model)."""
    return ctx.inputs.get("draft_model") or tiny_assets() / "draft"


def head_size(config_file: Path) -> int | None:
    """A model's attention head size from its config.json (`head_dim`, else hidden_size / num_attention_heads);
    None when the file does not say."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    head = config.get("head_dim")
    if isinstance(head, int) and head > 0:
        return head
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def cpu_check(ctx: StageContext) -> None:
    """SGLang's CPU engine: a draft it serves there, on a CPU with AMX (refused before any stage starts)."""
    if not serves_model(ctx):
        raise UserError(
            f"SGLang's CPU engine does not serve the {ctx.config.draft} draft (SGLang 0.5.18: "
            f"'{sglang_cpu.DFLASH_REFUSAL}')",
            field="serve.draft",
            value=ctx.config.serve.draft,
            fix="--opts serve.draft=model (a draft model under STANDALONE: the tiny preset's, or "
            "--opts serve.draft_model=DIR), or serve on a GPU",
        )
    if ctx.runtime == "local" and importlib.util.find_spec("sglang") is None:
        raise UserError(
            "SGLang is not installed in this environment, and the serve and bench stages run its CPU engine",
            field="--runtime",
            value="local",
            fix="--runtime docker (the sglang-cpu image: make image-sglang-cpu SGLANG_CPU_SOURCES=FILE)",
        )
    refusal = sglang_cpu.amx_refusal()
    if refusal:
        raise UserError(
            refusal,
            field="device",
            value="cpu",
            fix="run on a CPU with AMX (an Intel Xeon of the 4th generation or later), or on a GPU",
        )
    model, _ = host_model_paths(ctx.config, ctx.preset)
    for what, folder in (("target", model), ("draft model", draft_model_folder(ctx))):
        size = head_size(folder / "config.json")
        if size is not None and size % sglang_cpu.HEAD_SIZE_MULTIPLE:
            raise UserError(
                f"SGLang's CPU attention kernel takes head sizes that are multiples of "
                f"{sglang_cpu.HEAD_SIZE_MULTIPLE} (sgl_kernel: 'invalid head_size'), and the {what}'s is {size} "
                f"({folder / 'config.json'})",
                field="serve.draft_model" if what == "draft model" else "model_path",
                value=str(folder),
                fix="serve models whose head_dim is a multiple of 32 (--opts model_path=DIR, "
                "--opts serve.draft_model=DIR), or serve on a GPU",
            )


def _check_model_draft(ctx: StageContext) -> None:
    if serves_model(ctx) and ctx.preset.source != "kit" and "draft_model" not in ctx.inputs:
        raise UserError(
            f"the preset '{ctx.preset.name}' has no draft model to serve (only the tiny preset's is the kit's)",
            field="serve.draft",
            value="model",
            fix="--opts serve.draft_model=DIR (a local draft model), or --opts serve.draft=converted",
        )
    if ctx.config.serve.draft_model and not serves_model(ctx):
        raise UserError(
            "serve.draft_model is served only with serve.draft=model",
            field="serve.draft_model",
            value=ctx.config.serve.draft_model,
            fix="add --opts serve.draft=model",
        )


def sglang_command(ctx: StageContext, inst) -> Command:
    opts = ctx.config.serve
    if ctx.cpu:
        argv = sglang_cpu.launch_argv(
            ctx.layout.model,
            inst.port,
            tokenizer=ctx.layout.tokenizer,
            seed=ctx.config.seed,
            context_length=served_context_length(ctx),
            draft=draft_path(ctx),
            draft_steps=opts.draft_steps,
        )
        return Command(f"server-{inst.index}", tuple(argv), env=dict(sglang_cpu.CPU_ENV), port=inst.port)
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        ctx.layout.model,
        "--tp-size",
        str(inst.tp),
        "--host",
        "127.0.0.1",
        "--port",
        str(inst.port),
        "--enable-metrics",
        "--mem-fraction-static",
        str(opts.mem_fraction_static),
        "--context-length",
        str(served_context_length(ctx)),
        "--max-running-requests",
        str(opts.max_running_requests),
        "--disable-radix-cache",
        "--random-seed",
        str(ctx.config.seed),
        "--speculative-algorithm",
        algorithm(ctx),
        "--speculative-draft-model-path",
        draft_path(ctx),
    ]
    if serves_model(ctx):
        argv += [
            "--tokenizer-path",
            ctx.layout.tokenizer,
            "--speculative-num-steps",
            str(opts.draft_steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(draft_tokens(ctx)),
        ]
    elif ctx.config.draft == "dspark":
        argv += ["--speculative-dspark-block-size", str(draft_tokens(ctx))]
    else:
        argv += ["--speculative-num-draft-tokens", str(draft_tokens(ctx))]
    return Command(f"server-{inst.index}", tuple(argv), env=inst.env(), gpus=inst.gpus, port=inst.port)


def commands(ctx: StageContext) -> list[Command]:
    return [sglang_command(ctx, inst) for inst in instances(ctx)]


def argv(ctx: StageContext) -> list[str]:
    return kit_argv(
        ctx,
        NAME,
        "serve",
        [
            "--commands",
            ctx.layout.at("stages", "serve.commands.json"),
            "--plan",
            ctx.layout.at("serve", "plan.json"),
            "--algorithm",
            algorithm(ctx),
            "--draft-path",
            draft_path(ctx),
            "--startup-timeout",
            str(ctx.config.serve.startup_timeout_s),
        ],
    )


def inputs(ctx: StageContext) -> list[Artifact]:
    _check_model_draft(ctx)
    if serves_model(ctx):
        folder = draft_model_folder(ctx)
        drafts = [
            Artifact("draft model config", folder / "config.json"),
            Artifact("draft model weights", folder / "model.safetensors"),
        ]
    else:
        drafts = [
            Artifact("draft config", ctx.host("draft", "config.json")),
            Artifact("draft weights", ctx.host("draft", "model.safetensors")),
        ]
    return [*drafts, *model_artifacts(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("plan", ctx.host("serve", "plan.json"), schema="stage-serve")]


def notes(ctx: StageContext) -> list[str]:
    found = instances(ctx)
    served = (
        f"the preset's draft model under STANDALONE, {ctx.config.serve.draft_steps} drafted token(s) a step"
        if serves_model(ctx)
        else f"the converted {ctx.config.draft} draft under {algorithm(ctx)}"
    )
    if ctx.cpu:
        return [
            f"1 SGLang instance on its CPU engine (image {CPU_IMAGE}, port {found[0].port}), serving {served}",
            "SGLang's CPU engine serves a draft on a CPU with AMX only",
        ]
    masks = "; ".join(f"#{i.index}: GPUs {list(i.gpus)} TP {i.tp} port {i.port}" for i in found)
    return [f"{len(found)} SGLang instance(s), no GPU shared ({masks}), serving {served}"]


STAGE = Stage(
    name=NAME,
    image="sglang",
    summary="SGLang with the converted draft, one instance per GPU mask (validated before start)",
    uses_gpu=True,
    output_schema="stage-serve",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    commands=commands,
    notes=notes,
    entries=(Entry(NAME, "SGLang instances", runner.add_arguments, runner.main),),
    engine="sglang",
    cpu_image=CPU_IMAGE,
    cpu_check=cpu_check,
)
