"""regen: the target answers every chat prompt itself (on-policy data), served by N vLLM instances.

Each instance gets its own GPU mask (`CUDA_VISIBLE_DEVICES`), tensor-parallel size and port, and never shares a GPU
with another (docs/integration-bugs.md, bug 5); hybrid (GDN) targets get vLLM's custom all-reduce turned off (docs/integration-bugs.md, bug 1). The
in-container client shards the rows over the instances, retries transient HTTP failures with backoff, resumes by
row id and ends with every input row either regenerated or in the errors file (`ok + errors == input`, bug 6).

Output: `regen/rows.jsonl` (the input rows with the final assistant turn replaced by the target's greedy reply),
`regen/errors.jsonl`, `regen/summary.json` (schema `stage-regen`).
"""

from __future__ import annotations

from draftscope.pipeline.base import (
    Artifact,
    Command,
    Entry,
    Stage,
    StageContext,
    chat_file,
    chat_input,
    hybrid_vllm_flags,
    kit_argv,
    resolve_instances,
)
from draftscope.pipeline.stages.regen import client, tinyserve

NAME = "regen"
SERVED_NAME = "target"  # the model name the client asks the servers for
TINYSERVE = "tinyserve"  # the CPU path's server: an entry of this stage, started by the client like vLLM


def instances(ctx: StageContext):
    return resolve_instances(ctx, ctx.config.regen.instances, ctx.config.regen.base_port, "regen")


def max_model_len(ctx: StageContext) -> int:
    return ctx.config.regen.max_model_len or ctx.preset.training.seq_length


def max_tokens(ctx: StageContext) -> int:
    """New tokens per reply: the configured value, else half the training sequence (at most 2048), so that the
    prompt and the reply fit a training row."""
    return ctx.config.regen.max_tokens or min(2048, max(1, ctx.preset.training.seq_length // 2))


def server_command(ctx: StageContext, inst) -> Command:
    """One target server: `vllm serve` on the instance's GPUs (the kit's loopback server for the CPU tiny path)."""
    opts = ctx.config.regen
    if ctx.cpu:
        argv = [
            "python",
            "-m",
            "draftscope.pipeline",
            TINYSERVE,
            "--model",
            ctx.layout.model,
            "--tokenizer",
            ctx.layout.tokenizer,
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(inst.port),
        ]
        return Command(f"server-{inst.index}", tuple(argv), port=inst.port)
    argv = [
        "vllm",
        "serve",
        ctx.layout.model,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(inst.port),
        "--tensor-parallel-size",
        str(inst.tp),
        "--max-model-len",
        str(max_model_len(ctx)),
        "--gpu-memory-utilization",
        str(opts.gpu_memory_utilization),
        "--seed",
        str(ctx.config.seed),
        # The client sets every sampling parameter; the checkpoint's generation_config must not change them.
        "--generation-config",
        "vllm",
        *hybrid_vllm_flags(ctx.preset),
    ]
    return Command(f"server-{inst.index}", tuple(argv), env=inst.env(), gpus=inst.gpus, port=inst.port)


def commands(ctx: StageContext) -> list[Command]:
    return [server_command(ctx, inst) for inst in instances(ctx)]


def input_rows(ctx: StageContext) -> str:
    return ctx.layout.chat


def argv(ctx: StageContext) -> list[str]:
    opts = ctx.config.regen
    out = kit_argv(
        ctx,
        NAME,
        "regen",
        [
            "--commands",
            ctx.layout.at("stages", "regen.commands.json"),
            "--input",
            input_rows(ctx),
            "--output-dir",
            ctx.layout.at("regen"),
            "--model",
            SERVED_NAME,
            "--max-tokens",
            str(max_tokens(ctx)),
            "--temperature",
            str(opts.temperature),
            "--seed",
            str(ctx.config.seed),
            "--concurrency",
            str(opts.concurrency),
            "--max-retries",
            str(opts.max_retries),
            "--request-timeout",
            str(opts.request_timeout_s),
            "--startup-timeout",
            str(opts.startup_timeout_s),
        ],
    )
    if ctx.config.data.max_rows:
        out += ["--max-rows", str(ctx.config.data.max_rows)]
    return out


def inputs(ctx: StageContext) -> list[Artifact]:
    return [chat_input(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("rows", ctx.host("regen", "rows.jsonl")),
        Artifact("errors", ctx.host("regen", "errors.jsonl")),
        Artifact("summary", ctx.host("regen", "summary.json"), schema="stage-regen"),
    ]


def notes(ctx: StageContext) -> list[str]:
    out = [f"{len(instances(ctx))} target instance(s); rows sharded over them; resumable by row id"]
    if ctx.preset.architecture.is_hybrid:
        out.append(
            "hybrid (GDN) target: --disable-custom-all-reduce --distributed-executor-backend mp (docs/integration-bugs.md, bug 1)"
        )
    return out


def check_inputs(ctx: StageContext) -> None:
    """Every chat row is read once before anything is written: an id, messages, something to answer."""
    path = chat_file(ctx)
    if path is not None:
        client.read_rows(path, ctx.config.data.max_rows)


STAGE = Stage(
    name=NAME,
    image="vllm",
    summary="the target regenerates every reply (N vLLM instances, sharded, resumable)",
    uses_gpu=True,
    output_schema="stage-regen",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    commands=commands,
    notes=notes,
    entries=(
        Entry(NAME, "target servers + regen client", client.add_arguments, client.main),
        Entry(
            TINYSERVE,
            "the tiny target behind an OpenAI-compatible chat endpoint (CPU)",
            tinyserve.add_arguments,
            tinyserve.main,
            recorded=False,
        ),
    ),
    engine="vllm",
    check_inputs=check_inputs,
)
