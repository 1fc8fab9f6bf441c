"""The vLLM backend's config side, pure (no torch, no vLLM): the rules a config must follow, what the plan and the
dry run say about it, and every argument the worker hands to vLLM.

`engine_args` is a pure function of the config and the preset, so the dry run can print it, the unit tests can
check it, and the contract test (`tests/contract/test_vllm_backend.py`) can check every key and value against the
pinned release (`backend.PINNED_VERSION`). The engine that passes them is `backend.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from draftscope.bench.backends.common import choose_dtype, head_refused, head_used, prefix_refused
from draftscope.core.errors import UserError
from draftscope.core.presets import ExperimentConfig, HubRef, ModelPreset, resolve_draft, resolve_target

DEVICES = ("cuda",)

# Values vLLM must accept (checked against the release by the contract test).
SPEC_METHOD = "dflash"
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


# --- the config's rules, the plan's notes, the dry run's lines ----------------------------------------------


def check(config: ExperimentConfig) -> None:
    """The rules a vLLM benchmark's config must follow, checked when it is planned."""
    # The certified head runs only in the kit's own loop; vLLM's equivalent is the experimental prefix head.
    if head_used(config):
        raise head_refused(config)
    if config.experimental_prefix and not config.int4_dflash:
        raise prefix_refused()
    if config.device not in DEVICES:
        raise UserError(
            "the vLLM backend runs only on an NVIDIA GPU",
            field="device",
            value=config.device,
            fix="use --device cuda, or --backend transformers for a CPU run",
        )


def notes(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    if preset.architecture.is_hybrid:
        executor = f"{HYBRID_EXECUTOR} executor"
        return (
            f"hybrid (linear-attention) target: custom all-reduce off, {executor} (docs/integration-bugs.md, bug 1)",
        )
    return ()


def dry_run_lines(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    """The engine arguments, as the worker will pass them (the dtype is decided by the GPU the run finds)."""
    args = engine_args(config, preset, capability=None, require_pins=False)
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
) -> dict[str, Any]:
    """The keyword arguments of vLLM's `EngineArgs` for this experiment, exactly as the worker passes them.

    - Target: `resolve_target` (with `int4_dflash`, the preset's INT4 checkpoint), at its pinned revision; the
      tokenizer at the same revision. Quantization is not passed: vLLM reads it from the checkpoint's own
      `quantization_config` (compressed-tensors W4A16 for the INT4 preset), so nothing can contradict it.
    - Draft: `resolve_draft` (with `int4_dflash`, the preset's DFlash2 draft) as a `dflash` speculative config
      with `num_speculative_tokens = block_size - 1` and the draft's own revision.
    - dtype: the kit's rule made explicit (bfloat16 on capability >= 8.0, else float16) rather than vLLM's
      "auto", which would follow the checkpoint's config and could differ from the Transformers baseline.
    - Prefix caching off (on by default in vLLM V1), remote code never, memory fraction → GPU memory
      utilization, statistics on (the spec-decode counters need them).
    - Hybrid (linear-attention) targets: custom all-reduce off and the multiprocessing executor (integration
      bug 1). `VLLM_BATCH_INVARIANT` is never set.

    `require_pins=False` lets a dry run show an unpinned checkpoint (revision None); a real run refuses it.
    """
    if config.backend != "vllm":
        raise UserError("engine arguments are for the vLLM backend", field="backend", value=config.backend)
    target = resolve_target(config, preset)
    if target is None:
        raise UserError(
            f"model preset '{preset.name}' is built by the kit and cannot be served by vLLM",
            field="model_preset",
            value=preset.name,
            fix="choose a hub preset (invoke presets), or --backend transformers for the tiny model",
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
        "trust_remote_code": False,
        "dtype": _dtype(config, capability),
        "seed": config.seed,
        "gpu_memory_utilization": config.memory_fraction,
        "tensor_parallel_size": config.vllm.tensor_parallel_size,
        "enforce_eager": config.vllm.enforce_eager,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
    }
    if config.vllm.max_model_len is not None:
        args["max_model_len"] = config.vllm.max_model_len
    if config.vllm.attention_backend is not None:
        args["attention_backend"] = config.vllm.attention_backend
    if draft is not None:
        args["speculative_config"] = speculative_config(draft, preset)
        args["per_request_spec_decode_metrics"] = SPEC_METRICS_LEVEL
    if preset.architecture.is_hybrid:
        args["disable_custom_all_reduce"] = True
        args["distributed_executor_backend"] = HYBRID_EXECUTOR
    return args


def num_speculative_tokens(preset: ModelPreset) -> int:
    """DFlash fills a block of `block_size` positions whose first holds the last committed token, so it
    proposes `block_size - 1` tokens per step (docs/upstream-facts.md, vLLM)."""
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
    if config.dtype != "auto" or capability is not None:
        return choose_dtype(config.dtype, "cuda", capability)
    return DTYPE_AT_RUN_TIME
