"""hsextract: the target's hidden states for every prepared row, in speculators' offline layout.

Real presets: per instance, the kit starts `vllm serve` (`python -m vllm.entrypoints.cli.main serve`) with vLLM's
`extract_hidden_states` speculative method and its `ExampleHiddenStatesConnector`, which writes each request's
hidden states to a scratch folder, on that instance's GPUs (own `CUDA_VISIBLE_DEVICES`, TP and port; GDN flags for
hybrid targets) — the engine configuration speculators' `scripts/launch_vllm.py` builds, which its wheel does not
ship (`speculative_config`, `kv_transfer_config` below; docs/use/pipeline.md). One
`speculators generate-offline-data` client per instance takes a contiguous shard of the rows
(`--world-size N --rank i`). The client skips rows whose file exists, so a rerun resumes; `--fail-on-error` makes a
row that still fails after its retries fail the stage instead of leaving a silent hole for training
(`--on-missing raise`). Prefix caching is off: every token's hidden states must be computed, not served from cache.

The `tiny` preset (CPU): a Transformers extractor writes the same files — `hs_<row>.safetensors` with `token_ids [T]`
and `hidden_states [T, n_aux + 1, H]`, the auxiliary layers in order and the final layer last.

Output: `hidden_states/hs_<row>.safetensors` and `hsextract/summary.json` (schema `stage-hsextract`).

Under Slurm (`execute/slurm/shards.py`) the stage is a job array: task I of N runs this step on its contiguous block of rows
(real presets: the clients' `--world-size N*k --rank I*k+i`; tiny: the extractor's `--world-size N --rank I`),
writing into the same `hidden_states/`; a check job then runs `check_argv` (`hsextract-check`) over the whole output.
"""

from __future__ import annotations

import json

from draftscope.pipeline.base import (
    Artifact,
    Command,
    Entry,
    Stage,
    StageContext,
    captured_layer_ids,
    hybrid_vllm_flags,
    kit_argv,
    model_artifacts,
    resolve_instances,
    speculators_layer_ids,
)
from draftscope.pipeline.stages.hsextract import runner, transformers_extractor

# vLLM's names, re-exported: the stage's contract test checks them through the stage against the pinned wheel.
from draftscope.pipeline.stages.hsextract.vllm_args import CONNECTOR as CONNECTOR
from draftscope.pipeline.stages.hsextract.vllm_args import EXTRACT_METHOD as EXTRACT_METHOD
from draftscope.pipeline.stages.hsextract.vllm_args import KV_ROLE as KV_ROLE
from draftscope.pipeline.stages.hsextract.vllm_args import LAYER_IDS_KEY as LAYER_IDS_KEY
from draftscope.pipeline.stages.hsextract.vllm_args import STORAGE_PATH_KEY as STORAGE_PATH_KEY
from draftscope.pipeline.stages.hsextract.vllm_args import VLLM_CLI, kv_transfer_config, speculative_config

NAME = "hsextract"
# The stage's other in-container commands (entries): the CPU extractor, and the check after a Slurm job array.
EXTRACT_TRANSFORMERS = "hsextract-transformers"
CHECK = "hsextract-check"


def instances(ctx: StageContext):
    return resolve_instances(ctx, ctx.config.hsextract.instances, ctx.config.hsextract.base_port, "hsextract")


def uses_vllm(ctx: StageContext) -> bool:
    return not ctx.cpu


def server_command(ctx: StageContext, inst, scratch: str | None = None) -> Command:
    """`scratch`: where vLLM's connector writes (default `hsextract/scratch-<i>`; a Slurm array task has its own)."""
    opts = ctx.config.hsextract
    layers = speculative_config(speculators_layer_ids(ctx.preset), ctx.preset.architecture.num_layers)
    # vLLM's connector writes here; the client moves each row's file into the output folder.
    transfer = kv_transfer_config(scratch or ctx.layout.at("hsextract", f"scratch-{inst.index}"))
    argv = [
        "python",
        "-m",
        VLLM_CLI,
        "serve",
        ctx.layout.model,
        "--speculative-config",
        json.dumps(layers),
        "--kv-transfer-config",
        json.dumps(transfer),
        "--host",
        "127.0.0.1",
        "--port",
        str(inst.port),
        "--tensor-parallel-size",
        str(inst.tp),
        "--max-model-len",
        str(opts.max_model_len or ctx.preset.training.seq_length),
        "--gpu-memory-utilization",
        str(opts.gpu_memory_utilization),
        "--no-enable-prefix-caching",
        "--seed",
        str(ctx.config.seed),
        *hybrid_vllm_flags(ctx.preset),
    ]
    return Command(f"server-{inst.index}", tuple(argv), env=inst.env(), gpus=inst.gpus, port=inst.port)


def client_command(ctx: StageContext, inst, world_size: int, rank: int | None = None) -> Command:
    """`rank`: this client's contiguous block of rows (default the instance's index; a Slurm array task I of
    instances-per-task k has ranks I*k + i of a world of N*k)."""
    opts = ctx.config.hsextract
    argv = [
        "python",
        "-m",
        "speculators",
        "generate-offline-data",
        "--preprocessed-data",
        ctx.layout.at("prepare"),
        "--endpoint",
        f"{inst.url()}/v1",
        "--output",
        ctx.layout.at("hidden_states"),
        "--concurrency",
        str(opts.concurrency),
        "--max-retries",
        str(opts.max_retries),
        "--fail-on-error",
        "--validate-outputs",
        "--world-size",
        str(world_size),
        "--rank",
        str(inst.index if rank is None else rank),
    ]
    if opts.request_timeout_s:
        argv += ["--request-timeout", str(opts.request_timeout_s)]
    return Command(f"client-{inst.index}", tuple(argv))


def commands(ctx: StageContext) -> list[Command]:
    if not uses_vllm(ctx):
        return []
    found = instances(ctx)
    return [server_command(ctx, i) for i in found] + [client_command(ctx, i, len(found)) for i in found]


def data_args(ctx: StageContext) -> list[str]:
    """What every hsextract command reads and writes: the dataset, the hidden states, the summary, the layers."""
    return [
        "--data",
        ctx.layout.at("prepare"),
        "--output",
        ctx.layout.at("hidden_states"),
        "--summary",
        ctx.layout.at("hsextract", "summary.json"),
        "--layer-ids",
        *map(str, captured_layer_ids(ctx.preset)),
    ]


def argv(ctx: StageContext) -> list[str]:
    common = data_args(ctx)
    if uses_vllm(ctx):
        return kit_argv(
            ctx,
            NAME,
            "hsextract",
            [
                "--commands",
                ctx.layout.at("stages", "hsextract.commands.json"),
                *common,
                "--hidden-size",
                str(ctx.preset.architecture.hidden_size),
            ],
        )
    return kit_argv(
        ctx,
        NAME,
        EXTRACT_TRANSFORMERS,
        [
            "--model",
            ctx.layout.model,
            *common,
            "--dtype",
            ctx.config.train.hidden_states_dtype,
        ],
    )


def check_argv(ctx: StageContext) -> list[str]:
    """The whole-output check of a Slurm job array's result (`python -m draftscope.pipeline hsextract-check`):
    every row has its file, sampled shapes; writes the stage's summary and result as a single run does."""
    args = [*data_args(ctx), "--extractor", "vllm" if uses_vllm(ctx) else "transformers"]
    if uses_vllm(ctx):
        args += ["--hidden-size", str(ctx.preset.architecture.hidden_size)]
    return kit_argv(ctx, NAME, CHECK, args)


def inputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("dataset", ctx.host("prepare"), kind="tree"), *model_artifacts(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("hidden states", ctx.host("hidden_states"), kind="tree"),
        Artifact("summary", ctx.host("hsextract", "summary.json"), schema="stage-hsextract"),
    ]


def notes(ctx: StageContext) -> list[str]:
    layers = captured_layer_ids(ctx.preset)
    out = [
        f"hidden-state indices {layers[:-1]} + final {layers[-1]} (preset layer ids + 1; speculators' convention)"
    ]
    if uses_vllm(ctx):
        out.append(
            f"{len(instances(ctx))} vLLM instance(s), rows sharded with --world-size/--rank; resumable"
        )
        if ctx.preset.architecture.is_hybrid:
            out.append(
                "hybrid (GDN) target: --disable-custom-all-reduce --distributed-executor-backend mp (docs/develop/integration-bugs.md, bug 1)"
            )
    else:
        out.append("CPU: the kit's Transformers extractor writes speculators' hs_<row>.safetensors layout")
    return out


STAGE = Stage(
    name=NAME,
    image="train",
    summary="target hidden states per row (vLLM extract_hidden_states + speculators generate-offline-data; tiny: Transformers)",
    uses_gpu=True,
    output_schema="stage-hsextract",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    commands=commands,
    notes=notes,
    entries=(
        Entry(NAME, "vLLM hidden-state servers + clients", runner.add_arguments, runner.main),
        Entry(
            EXTRACT_TRANSFORMERS,
            "hidden states with Transformers (tiny, CPU)",
            transformers_extractor.add_arguments,
            transformers_extractor.main,
        ),
        Entry(
            CHECK,
            "check a Slurm job array's hidden states, write the summary",
            runner.add_check_arguments,
            runner.check_main,
        ),
    ),
    engine="vllm",
)
