"""serve: SGLang instances serving the target with the converted draft, one per GPU mask.

Each instance: `python -m sglang.launch_server` on its own GPUs (`CUDA_VISIBLE_DEVICES`), `--tp-size` equal to its
mask size, its own port, `--enable-metrics`, no radix (prefix) cache, and the speculative flags for the draft type:
DFlash and DFlash2 drafts run under `DFLASH` with `--speculative-num-draft-tokens` = the block size (DFlash2
checkpoints are dispatched on their architecture), DSpark under `DSPARK` with `--speculative-dspark-block-size` =
gamma (the drafted tokens per step, see convert). The plan is validated before anything starts: TP equals the
mask size, no GPU is shared, every GPU exists, ports are distinct and free.

The stage starts the instances, waits for each to report healthy, sends one greedy request each, writes
`serve/plan.json` (schema `stage-serve`) and stops them (`--hold` keeps them up until interrupted). The bench stage
starts the same instances itself. SGLang needs an NVIDIA GPU: there is no CPU path.
"""

from __future__ import annotations

from draftscope.pipeline.base import (
    Artifact,
    Command,
    Entry,
    Stage,
    StageContext,
    kit_argv,
    model_artifacts,
    resolve_instances,
    served_context_length,
)
from draftscope.pipeline.stages.convert.checkpoint import dspark_gamma
from draftscope.pipeline.stages.serve import runner

NAME = "serve"
# SGLang has no CPU build; the stage's client side is tested on a CPU against a loopback fake.
NO_CPU = "needs SGLang on an NVIDIA GPU; there is no CPU path (its client is tested on a CPU)"


def instances(ctx: StageContext):
    return resolve_instances(ctx, ctx.config.serve.instances, ctx.config.serve.base_port, "serve")


def algorithm(ctx: StageContext) -> str:
    return "DSPARK" if ctx.config.draft == "dspark" else "DFLASH"


def draft_tokens(ctx: StageContext) -> int:
    """Tokens per verification window: the block for DFLASH; gamma (drafted tokens) for DSPARK."""
    block = ctx.preset.dflash.block_size
    if ctx.config.draft == "dspark":
        return dspark_gamma(block, ctx.config.train.dspark.sample_from_anchor)
    return block


def sglang_command(ctx: StageContext, inst) -> Command:
    opts = ctx.config.serve
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
        ctx.layout.at("draft"),
    ]
    if ctx.config.draft == "dspark":
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
            ctx.layout.at("draft"),
            "--startup-timeout",
            str(ctx.config.serve.startup_timeout_s),
        ],
    )


def inputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("draft config", ctx.host("draft", "config.json")),
        Artifact("draft weights", ctx.host("draft", "model.safetensors")),
        *model_artifacts(ctx),
    ]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("plan", ctx.host("serve", "plan.json"), schema="stage-serve")]


def notes(ctx: StageContext) -> list[str]:
    found = instances(ctx)
    masks = "; ".join(f"#{i.index}: GPUs {list(i.gpus)} TP {i.tp} port {i.port}" for i in found)
    return [f"{len(found)} SGLang instance(s), no GPU shared ({masks})", "needs an NVIDIA GPU (no CPU path)"]


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
    cpu_refusal=NO_CPU,
)
