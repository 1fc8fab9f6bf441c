"""The pipeline's run config: draft type, model preset and each stage's options, frozen and validated.

Layers, lowest first: the kit's defaults (here), a `--config run.yaml` file, the `--draft`/`--preset` options,
then `--opts key=value`. The merged mapping is checked against `schemas/pipeline-config.schema.json` (unknown keys
are errors) before it becomes frozen dataclasses; cross-field rules the schema cannot state are checked in
`check`, each naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from draftscope.core.config import (
    build_as_typed,
    deep_merge,
    load_yaml,
    parse_opts,
    to_dict,
    typed_by,
    validated_as_typed,
)
from draftscope.core.errors import UserError
from draftscope.core.presets import ContainerOptions, ModelPreset, load_model_preset

DRAFTS = ("dflash", "dflash2", "dspark")
DEFAULT_DRAFT = "dflash"
DEFAULT_PRESET = "qwen38-27b"
SCHEMA = "pipeline-config"
TINY_CHAT = "examples/chat.jsonl"


@dataclass(frozen=True)
class Instance:
    """One server: its GPU mask (CUDA_VISIBLE_DEVICES), tensor-parallel size and port."""

    gpus: tuple[int, ...] = ()
    tp: int | None = None
    port: int | None = None


@dataclass(frozen=True)
class DataOptions:
    chat: str | None = None
    max_rows: int | None = None


@dataclass(frozen=True)
class RegenOptions:
    instances: tuple[Instance, ...] = ()
    base_port: int = 8100
    max_tokens: int | None = None  # default: min(2048, seq_length // 2) of the preset
    startup_timeout_s: float = 1800.0
    temperature: float = 0.0  # greedy: regenerated data is reproducible from the pinned target
    concurrency: int = 16
    max_retries: int = 5
    request_timeout_s: float = 600.0
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    # The target's server: vLLM's OpenAI server, or the kit's stand-in (`tinyserve`, the CPU fast path). Default:
    # vllm on a GPU, tinyserve on a CPU; `vllm` on a CPU runs vLLM's CPU backend (docs/use/pipeline.md).
    server: Literal["vllm", "tinyserve"] | None = None


@dataclass(frozen=True)
class PretokenizeOptions:
    max_length: int | None = None  # default: the preset's training.seq_length
    overlong: Literal["truncate", "drop"] = "truncate"
    min_loss_tokens: int = 1


@dataclass(frozen=True)
class PrepareOptions:
    seq_length: int | None = None
    max_samples: int | None = None
    workers: int | None = None
    minimum_valid_tokens: int | None = None


@dataclass(frozen=True)
class HsextractOptions:
    instances: tuple[Instance, ...] = ()
    base_port: int = 8200
    concurrency: int = 32
    max_retries: int = 3
    request_timeout_s: float | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None


@dataclass(frozen=True)
class DFlash2Options:
    # speculators 0.9.0's defaults (train/config/schema.py, DFlash2Args), written out so the argv is complete.
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    selector_loss_alpha: float = 1.0


@dataclass(frozen=True)
class DSparkOptions:
    markov_rank: int = 256
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    confidence_head_alpha: float = 1.0
    sample_from_anchor: bool = (
        True  # speculators' DSpark default; SGLang's DSPARK worker reads it from the config
    )


@dataclass(frozen=True)
class TrainOptions:
    gpus: tuple[int, ...] = ()  # default: the first training.nproc_per_node GPUs
    epochs: int | None = None
    max_steps: int | None = None
    lr: float | None = None
    optimizer: Literal["adamw", "muon"] | None = None
    num_workers: int | None = None
    checkpoint_freq: float | None = None
    loss_implementation: Literal["fused", "eager"] | None = None
    draft_attn_impl: Literal["simple_flex_attention", "sdpa", "eager"] | None = None
    hidden_states_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    sliding_window: int = 2048
    dflash2: DFlash2Options = field(default_factory=DFlash2Options)
    dspark: DSparkOptions = field(default_factory=DSparkOptions)


@dataclass(frozen=True)
class ConvertOptions:
    checkpoint: str | int = "latest"
    mask_probe: bool = True  # off only where torch and speculators cannot run (convert/probe.py)


@dataclass(frozen=True)
class ServeOptions:
    instances: tuple[Instance, ...] = ()
    base_port: int = 30000
    mem_fraction_static: float = 0.8
    context_length: int | None = None
    max_running_requests: int = 8
    startup_timeout_s: float = 1800.0
    # What SGLang serves as the draft: the draft convert wrote (DFLASH, DSPARK), or the preset's draft model
    # (STANDALONE, drafting `draft_steps` tokens a step). SGLang's CPU engine refuses DFLASH, so the CPU path serves
    # `model` (docs/use/pipeline.md).
    draft: Literal["converted", "model"] = "converted"
    draft_steps: int = 4
    # serve.draft=model: a local draft model folder (any preset); unset, the tiny preset's own draft model.
    draft_model: str | None = None


@dataclass(frozen=True)
class BenchOptions:
    prompts: str = "examples/prompts.json"
    max_new_tokens: int = 256
    repeats: int = 1


@dataclass(frozen=True)
class SlurmStageOptions:
    """Per-stage overrides of the Slurm launcher's settings (`slurm.stages.<stage>`)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int | None = None  # train only: nodes for torchrun, one task per node
    shards: int | None = None  # regen and hsextract: array tasks, each a shard of the rows on its own node
    time_limit_s: float | None = None  # Slurm's --time (whole minutes, rounded up)
    cpus_per_task: int | None = None
    mem: str | None = None  # the job's memory per node, e.g. 64G; 0 = all of the node's memory


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm launcher (`--executor slurm`): where jobs go and how big they are. Unused by the local launcher."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1  # train's nodes, regen's and hsextract's shards, unless a stage says otherwise
    cpus_per_task: int | None = None
    mem: str | None = None
    rdzv_port: int = 29500  # torchrun's c10d rendezvous on the first node of a training job
    poll_interval_s: float = 5.0  # squeue / scontrol while waiting for the jobs
    stages: Mapping[str, SlurmStageOptions] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineConfig:
    schema_version: int
    name: str
    draft: Literal["dflash", "dflash2", "dspark"]
    model_preset: str
    description: str = ""
    model_path: str | None = None
    device: Literal["cuda", "cpu"] = "cuda"
    gpus: int = 8
    seed: int = 0
    time_limits: Mapping[str, float] = field(default_factory=dict)
    container: ContainerOptions = field(default_factory=ContainerOptions)
    data: DataOptions = field(default_factory=DataOptions)
    regen: RegenOptions = field(default_factory=RegenOptions)
    pretokenize: PretokenizeOptions = field(default_factory=PretokenizeOptions)
    prepare: PrepareOptions = field(default_factory=PrepareOptions)
    hsextract: HsextractOptions = field(default_factory=HsextractOptions)
    train: TrainOptions = field(default_factory=TrainOptions)
    convert: ConvertOptions = field(default_factory=ConvertOptions)
    serve: ServeOptions = field(default_factory=ServeOptions)
    bench: BenchOptions = field(default_factory=BenchOptions)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


@dataclass(frozen=True)
class Resolved:
    """A validated config with its model preset, loaded once."""

    config: PipelineConfig
    preset: ModelPreset
    source: str


def _config_file(name: str) -> Path:
    """A run config: the path of a YAML file (its fields: schemas/pipeline-config.schema.json)."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    raise UserError(
        "run config not found",
        field="--config",
        value=name,
        fix="give the path of a YAML run config file (.yaml or .yml)",
    )


def load_pipeline_config(
    *,
    draft: str | None = None,
    preset: str | None = None,
    config_file: str | None = None,
    opts: Iterable[str] = (),
    overrides: Mapping[str, Any] | None = None,
    typed_flags: Mapping[str, str] | None = None,
) -> Resolved:
    """Defaults < config file < --draft/--preset (and `overrides`: other typed options, e.g. the Slurm flags)
    < --opts; validated as a whole, then frozen. `typed_flags` names the option behind each field (dotted), so
    that a problem with it is reported as that option's."""
    if draft is not None and draft not in DRAFTS:
        raise UserError(
            f"unknown draft type '{draft}'", field="--draft", fix=f"choose one of: {', '.join(DRAFTS)}"
        )
    data: dict[str, Any] = {"schema_version": 1}
    source = "defaults"
    if config_file:
        path = _config_file(config_file)
        loaded = load_yaml(path, expect=dict)
        data = deep_merge(data, loaded)
        source = str(path)
    flags = {k: v for k, v in {"draft": draft, "model_preset": preset}.items() if v is not None}
    data = deep_merge(data, flags)
    if overrides:
        data = deep_merge(data, overrides)
    opt_values = parse_opts(opts)
    typed = typed_by(typed_flags, {**flags, **(overrides or {})}, opt_values)
    data = deep_merge(data, opt_values)
    data.setdefault("draft", DEFAULT_DRAFT)
    data.setdefault("model_preset", DEFAULT_PRESET)
    data.setdefault("name", f"{data['model_preset']}-{data['draft']}")
    kit = isinstance(data["model_preset"], str) and load_model_preset(data["model_preset"]).source == "kit"
    if "device" not in data and isinstance(data["model_preset"], str):
        # The kit-built tiny models are the CPU path (docs/use/pipeline.md); every hub preset needs an NVIDIA GPU.
        data["device"] = "cpu" if kit else "cuda"
    if kit and isinstance(data.get("data", {}), dict) and data.get("data", {}).get("chat") is None:
        # The tiny path's own chat rows (examples/chat.jsonl, 64 requests) so that it runs with no input at all.
        data = deep_merge(data, {"data": {"chat": TINY_CHAT}})
    if flags or overrides or opt_values:
        source = f"{source} (with overrides)"
    validated_as_typed(data, SCHEMA, source, typed)
    config: PipelineConfig = build_as_typed(PipelineConfig, data, typed)
    model = load_model_preset(config.model_preset)
    check(config, model, source)
    return Resolved(config, model, source)


def check(config: PipelineConfig, preset: ModelPreset, source: str) -> None:
    """Rules across fields and the preset; each error names the field and the fix."""
    if config.device == "cpu" and preset.source != "kit" and config.model_path is None:
        # The CPU path is for the kit-built tiny models, or a small local model given explicitly (tests, smoke runs).
        raise UserError(
            f"model preset '{preset.name}' cannot run on a CPU",
            source=source,
            field="device",
            value="cpu",
            fix="use device: cuda, or --preset tiny (or a small local model_path) for the CPU path",
        )
    if preset.source == "kit" and config.model_path is not None:
        raise UserError(
            "the tiny preset uses the kit-built models; model_path does not apply",
            source=source,
            field="model_path",
            value=config.model_path,
        )
    if config.regen.server == "tinyserve" and config.device != "cpu":
        raise UserError(
            "the stand-in server serves a small model on a CPU only",
            source=source,
            field="regen.server",
            value="tinyserve",
            fix="use regen.server=vllm (the default on a GPU), or device: cpu with the tiny preset",
        )
    for stage, options in config.slurm.stages.items():
        if options.nodes not in (None, 1) and stage != "train":
            raise UserError(
                "only the train stage spans several nodes (torchrun, one task per node)",
                source=source,
                field=f"slurm.stages.{stage}.nodes",
                value=options.nodes,
                fix="remove it"
                + (f"; {stage} uses slurm.stages.{stage}.shards" if stage in ("regen", "hsextract") else ""),
            )
        if options.shards is not None and stage not in ("regen", "hsextract"):
            raise UserError(
                "only regen and hsextract run as a job array of shards",
                source=source,
                field=f"slurm.stages.{stage}.shards",
                value=options.shards,
                fix="remove it",
            )
    if (
        config.draft == "dspark"
        and config.train.dspark.confidence_head_with_markov
        and (config.train.dspark.markov_rank <= 0)
    ):
        raise UserError(
            "the confidence head takes the Markov embedding, which needs markov_rank >= 1",
            source=source,
            field="train.dspark.confidence_head_with_markov",
        )
