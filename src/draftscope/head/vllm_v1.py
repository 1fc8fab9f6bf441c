"""The prefix head inside vLLM's V1 model runner on a CPU (vLLM's CPU engine 0.32 runs the V1 `CPUModelRunner`).

`vllm_plugin` hooks Model Runner V2 (vLLM 0.33 on CUDA). On a CPU engine whose runner is V1, the plugin uses this
module instead: the V1 runner computes the target's logits inside `execute_model` (`self.model.compute_logits`),
after `_calc_spec_decode_metadata` has built the step's draft tokens, and samples later in `sample_tokens`.
So two wrappers on the V1 `GPUModelRunner` (which `CPUModelRunner` inherits them from):

- `execute_model`: the step's context (the runner, a holder for the step's spec-decode metadata) for the
  duration of the call, so the head sees the step;
- `_calc_spec_decode_metadata`: stores its result (draft token ids, drafts per request) in the holder.

`route` then gives, per step, why some request must take the dense head (from each request's own
`SamplingParams`, and custom logits processors in the batch), or the rows' layout: request by request, each
request's draft rows then its bonus row (the order `_calc_spec_decode_metadata` builds `logits_indices` in); a
step without drafts has one (bonus) row per request. Everything here reads host-side state: no sync.

Names read from vLLM 0.32 are listed below (`V1_SYMBOLS`, `V1_ATTRS`); tests/unit/head/test_vllm_v1.py runs the
module against fakes carrying exactly those attributes, and tests/integration/test_vllm_cpu_engine.py in the real
CPU engine.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from draftscope.head.certify import NO_DRAFT

V1_SYMBOLS = {"GPUModelRunner": "vllm.v1.worker.gpu_model_runner"}  # the V1 runner (CPUModelRunner's base)
V1_HOOKS = {
    "execute_model": ("self", "scheduler_output", "intermediate_tensors"),
    "_calc_spec_decode_metadata": ("self", "num_draft_tokens", "cu_num_scheduled_tokens"),
}
V1_ATTRS = {
    "runner": ("model", "input_batch", "requests", "sampler", "rejection_sampler", "speculative_config"),
    "input_batch": ("req_ids", "logitsprocs"),
    "logitsprocs": ("all",),
    "request": ("sampling_params",),
    "sampling_params": (
        "temperature",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "allowed_token_ids",
        "bad_words",
        "thinking_token_budget",
        "logprobs",
        "prompt_logprobs",
        "structured_outputs",
    ),
    "spec_metadata": ("draft_token_ids", "num_draft_tokens"),
}
# Built-in logits processors (vllm.v1.sample.logits_processor.builtin) whose effect the per-request checks below
# already cover (min_p: argmax-invariant; logit bias and min_tokens: the request is refused). Any other one is a
# custom processor: the step takes the dense head.
BUILTIN_PROCESSORS = ("MinPLogitsProcessor", "LogitBiasLogitsProcessor", "MinTokensLogitsProcessor")
STANDARD_REJECTION = "standard"

_INELIGIBLE = (  # the labels vllm_plugin counts under
    "non-greedy sampling",
    "penalties, logit bias, bad words, min_tokens, allowed ids, thinking budget or custom processors",
    "logprobs",
    "structured output",
)


def runner_class() -> type:
    name = "GPUModelRunner"
    return getattr(importlib.import_module(V1_SYMBOLS[name]), name)


def install_runner_hooks(runner_cls: type, step_var: Any, make_step: Callable[[Any, dict], Any]) -> None:
    """Wrap the V1 runner's `execute_model` and `_calc_spec_decode_metadata` once per process. `make_step(runner,
    holder)` builds the step object `step_var` (a ContextVar) carries; `holder["spec"]` receives the metadata."""
    if getattr(runner_cls, "_draftscope_v1_hooked", False):
        return
    execute, calc = runner_cls.execute_model, runner_cls._calc_spec_decode_metadata

    @functools.wraps(execute)
    def wrapped_execute(self: Any, scheduler_output: Any, *a: Any, **kw: Any):
        token = step_var.set(make_step(self, {"spec": None}))
        try:
            return execute(self, scheduler_output, *a, **kw)
        finally:
            step_var.reset(token)

    @functools.wraps(calc)
    def wrapped_calc(self: Any, *a: Any, **kw: Any):
        metadata = calc(self, *a, **kw)
        step = step_var.get()
        if step is not None and step.v1 is not None:
            step.v1["spec"] = metadata
        return metadata

    runner_cls.execute_model = wrapped_execute
    runner_cls._calc_spec_decode_metadata = wrapped_calc
    runner_cls._draftscope_v1_hooked = True


def runner_missing(runner: Any) -> list[str]:
    """Engine-wide features of a V1 runner whose sampling is not a plain argmax of the head's logits."""
    missing = []
    spec = runner.speculative_config
    method = getattr(spec, "rejection_sample_method", STANDARD_REJECTION) if spec is not None else None
    if spec is not None and method != STANDARD_REJECTION:
        missing.append(f"rejection_sample_method={method!r}")
    sampler, rejection = runner.sampler, runner.rejection_sampler
    if type(sampler).__name__ != "Sampler" or type(rejection).__name__ not in (
        "RejectionSampler",
        "NoneType",
    ):
        missing.append(f"a custom sampler ({type(sampler).__name__}, {type(rejection).__name__})")
    return missing


def ineligible_reasons(runner: Any) -> list[str]:
    """Why some request of the step must take the dense head (empty: none must), from each request's own
    SamplingParams and the batch's logits processors."""
    batch = runner.input_batch
    flags = [False] * len(_INELIGIBLE)
    custom = [p for p in batch.logitsprocs.all if type(p).__name__ not in BUILTIN_PROCESSORS]
    flags[1] = bool(custom)
    for req_id in batch.req_ids:
        state = runner.requests.get(req_id)
        params = state.sampling_params if state is not None else None
        if params is None:  # a pooling request or an unknown one: not ours to certify
            flags[0] = True
            continue
        flags[0] |= params.temperature != 0.0
        flags[1] |= (
            params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0
            or bool(params.logit_bias)
            or params.min_tokens > 0
            or params.allowed_token_ids is not None
            or bool(params.bad_words)
            or params.thinking_token_budget is not None
        )
        flags[2] |= params.logprobs is not None or params.prompt_logprobs is not None
        flags[3] |= params.structured_outputs is not None
    return [reason for reason, flag in zip(_INELIGIBLE, flags, strict=True) if flag]


def layout(runner: Any, holder: dict, rows: int, device: torch.device) -> tuple[Any, ...] | None:
    """(request [rows], draft [rows], local_pos [rows], requests) of the step's logits rows, or None when the rows
    do not match the batch (the head then takes the dense path)."""
    requests = len(runner.input_batch.req_ids)
    spec = holder.get("spec")
    if spec is None:
        counts = [0] * requests
        drafts = torch.empty(0, dtype=torch.long)
    else:
        counts = [int(n) for n in spec.num_draft_tokens]
        drafts = spec.draft_token_ids.to("cpu", torch.long)
    if len(counts) != requests or sum(counts) + requests != rows or drafts.numel() != sum(counts):
        return None
    request, draft, local_pos = [], [], []
    start = 0
    for i, n in enumerate(counts):
        request += [i] * (n + 1)
        draft += [*drafts[start : start + n].tolist(), NO_DRAFT]
        local_pos += list(range(n + 1))
        start += n

    def put(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return put(request), put(draft), put(local_pos), requests
