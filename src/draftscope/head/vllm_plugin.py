"""The prefix-conditioned head inside vLLM (0.33, Model Runner V2): a `vllm.general_plugins` entry point.

vLLM calls `register()` in every one of its processes. With `DRAFTSCOPE_EXPERIMENTAL_PREFIX` unset it returns at
once. With it set (`vllm_switch.settings_from_env`), it registers `PrefixLogitsProcessor` as the out-of-tree
replacement of `LogitsProcessor` (`LogitsProcessor.register_oot`, i.e. `PluggableLayer.register_oot`: every later
`LogitsProcessor(...)` builds ours). The replacement's first construction, inside the worker's model load,
wraps three methods of the V2 runner (`GPUModelRunner.sample`, `._dummy_sampler_run`, `.shutdown`): the wrappers
put the step's input batch and grammar output in a context variable, which is how draft tokens and the
row → request map reach the head (the head itself only receives `(lm_head, hidden_states)`). On a CPU whose vLLM runs
the V1 runner (vLLM's CPU engine 0.32), `vllm_v1` wraps that runner instead and routes each step the same way.

Then, on the target's head (the processor found inside `runner.model`; a draft model's copy stays stock):
- first call (normally the profiling run, so that vLLM's memory profile counts the copy): check the
  prerequisites, choose the implementation for the device (`select.select`: on CUDA the Triton kernels inside one
  captured conditional graph per row bucket, else the eager kernels or the reference, each with the reason the
  graph was not chosen; on a CPU the CPU coarse pass `select.coarse_impl`), build the INT8 head in vocabulary
  chunks and run the startup check with the chosen stages (certified vs dense on synthetic rows: any
  disagreement refuses activation) — engine-independent pieces live in `serving`. A missing prerequisite leaves
  the stock head with the reason in the status file; CUDA errors are re-raised (the run stops).
- each sampling step: requests that are not plain greedy (temperature ≠ 0, penalties / bias / bad words /
  min_tokens / allowed ids / thinking budget / custom processors, logprobs, structured output) make the whole step
  dense, as do steps with more than `max_rows` rows. Otherwise every row is certified, the prefix rule decides,
  and the head returns either the dense logits (the same op as stock, under the reference contract) or
  argmax-equivalent logits: 0 at the certified token, −inf elsewhere. vLLM's greedy sampler and greedy rejection
  kernels take a plain (block-wise, lowest-index) argmax of those rows, so they pick exactly the certified token;
  rows after the first rejection are never read. On `cuda-graph` the decision stays on the device: one replay
  certifies, runs the dense head in the IF node when the prefix rule asks for it, and the head returns
  argmax-equivalent logits of the resulting tokens (no host sync). The eager implementations decide on the host
  (one sync per step) and hand vLLM's own dense logits over on a fallback.
- counters stay on the device (`runtime.HeadCounters`; the graph adds to them itself), are read every
  `read_every` steps and at shutdown, and go to the status file with the memory the INT8 copy added and the
  implementation chosen (`implementation`: name, coarse pass, graph, reason).

Every vLLM name used is listed below and checked against the pinned release by
`tests/contract/test_vllm_prefix_plugin_names.py`; `tests/unit/head/test_vllm_prefix_plugin.py` runs this module against fakes
carrying exactly the declared attributes.

Over ~400 lines on purpose: vLLM imports this module by its entry-point name in every engine process, and the
registration, the runner wrappers and the processor share one context variable and one set of counters.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import importlib
import logging
import multiprocessing.util
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from draftscope.head import select, serving, triton_cache, vllm_v1
from draftscope.head import vllm_switch as switch
from draftscope.head.certify import NO_DRAFT, certify
from draftscope.head.policy import prefix_decision, rowwise_decision
from draftscope.head.quant import QuantizedHead
from draftscope.head.runtime import HeadCounters

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = (
    "draftscope_prefix_head"  # what VLLM_PLUGINS would have to list, if a run restricts plugins
)
ENTRY_POINT = "draftscope.head.vllm_plugin:register"
PINNED_VERSION = "0.33.0"  # = bench.backends.vllm.PINNED_VERSION (the contract test checks they agree)

# --- the contract with vLLM 0.33.0 -------------------------------------------------------------------------------

SYMBOLS = {
    "LogitsProcessor": "vllm.model_executor.layers.logits_processor",
    "op_registry_oot": "vllm.model_executor.custom_op",
    "get_current_vllm_config": "vllm.config",
    "GPUModelRunner": "vllm.v1.worker.gpu.model_runner",  # Model Runner V2, the default in 0.33
    "NO_LOGPROBS": "vllm.v1.worker.gpu.sample.states",
}
OOT_NAME = "LogitsProcessor"  # the key register_oot files the replacement under (the in-tree class name)
RUNNER_HOOKS = {  # method → its parameters in the pinned runner
    "sample": ("self", "hidden_states", "input_batch", "grammar_output"),
    "_dummy_sampler_run": ("self", "hidden_states"),
    "shutdown": ("self",),
}
PROCESSOR_FORWARD = ("self", "lm_head", "hidden_states", "embedding_bias", "skip_gather")
DENSE_HEAD_METHODS = {  # quant methods whose apply() is the plain bf16 GEMM the certificate is made for
    "UnquantizedEmbeddingMethod": "vllm.model_executor.layers.vocab_parallel_embedding",
    "UnquantizedLinearMethod": "vllm.model_executor.layers.linear",
}
SAMPLER_CLASSES = {  # the stock samplers the eligibility rules and the greedy argmax facts are read from
    "Sampler": "vllm.v1.worker.gpu.sample.sampler",
    "RejectionSampler": "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
}
V1_RUNNER = "the V1 model runner is in use; the plugin hooks Model Runner V2 only"
STANDARD_REJECTION = "standard"  # SpeculativeConfig.rejection_sample_method: other methods change acceptance
# Attributes read, by the variable name the code gives each kind of vLLM object (the contract test checks that
# nothing else is read, and the unit fakes carry exactly these).
ATTRS = {
    "processor": ("scale", "soft_cap", "logits_as_input", "org_vocab_size", "head_dtype"),
    "lm_head": ("weight", "tp_size", "quant_method"),
    "vllm_config": ("use_v2_model_runner", "watermark_config"),
    "runner": (
        "model",
        "sampler",
        "rejection_sampler",
        "batch_sharder",
        "model_state",
        "speculative_config",
        "vllm_config",
    ),
    "model_state": ("num_new_sampled_tokens_per_step",),
    "spec": ("rejection_sample_method",),
    "sampler": (
        "sampling_states",
        "needs_logits_processing",
        "logprob_token_ids_state",
        "trace_replay_state",
        "return_sampling_mask",
    ),
    "states": ("temperature", "num_logprobs"),
    "token_ids_state": ("num_token_ids",),
    "batch": ("num_reqs", "req_ids", "idx_mapping_np", "input_ids", "logits_indices", "expanded_local_pos"),
    "grammar": ("structured_output_request_ids",),
}
UVA_ATTRS = ("np",)  # UvaBackedTensor: the host copy of temperature / num_token_ids


def _symbol(name: str) -> Any:
    """A vLLM object from the module `SYMBOLS` names for it (imported only when the switch is on)."""
    return getattr(importlib.import_module(SYMBOLS[name]), name)


# --- the entry point --------------------------------------------------------------------------------------------

_PLUGIN: _Plugin | None = None
_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar("draftscope_prefix_step", default=None)


def register() -> None:
    """The `vllm.general_plugins` entry point: nothing unless the kit's switch is on."""
    global _PLUGIN
    settings = switch.settings_from_env()
    if settings is None or _PLUGIN is not None:
        return
    plugin = _Plugin(settings)
    _PLUGIN = plugin
    # Before any Triton compile of this process: the image's ahead-of-time kernels become cache hits (triton_cache).
    plugin.facts["triton_aot"] = triton_cache.use_image_cache()
    registry = _symbol("op_registry_oot")
    if OOT_NAME in registry:
        plugin.stay_stock(f"another plugin already replaced {OOT_NAME} ({registry[OOT_NAME].__name__})")
        return
    base = _symbol("LogitsProcessor")
    base.register_oot(processor_class(base))
    atexit.register(plugin.close)
    # Forked multiprocessing children skip atexit handlers but run multiprocessing's finalizers.
    with contextlib.suppress(Exception):
        multiprocessing.util.Finalize(None, plugin.close, exitpriority=10)


def processor_class(base: type) -> type:
    """The replacement for vLLM's `LogitsProcessor` (`base`): stock unless the plugin routes a call."""

    class PrefixLogitsProcessor(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._draftscope_target: bool | None = None  # decided on the first routed call
            if _PLUGIN is not None:
                _PLUGIN.processor_created()

        def forward(
            self, lm_head: Any, hidden_states: Any, embedding_bias: Any = None, skip_gather: bool = False
        ) -> Any:
            def dense(hidden: Any = hidden_states) -> Any:
                return base.forward(self, lm_head, hidden, embedding_bias, skip_gather)

            step = _STEP.get()
            if _PLUGIN is None or step is None or skip_gather:
                return dense()
            return _PLUGIN.logits(self, lm_head, hidden_states, embedding_bias, step, dense)

    return PrefixLogitsProcessor


@dataclass(frozen=True)
class Step:
    """What the runner wrappers hand to the head: the runner, and the step's batch (None while profiling)."""

    runner: Any
    batch: Any = None
    grammar: Any = None
    v1: dict | None = None  # the V1 runner's step (vllm_v1): a holder for its spec-decode metadata

    @property
    def profile(self) -> bool:
        return self.batch is None and self.v1 is None


def install_runner_hooks() -> None:
    """Wrap the V2 runner's sampling call (and its profiling twin and shutdown) once per process."""
    runner_cls = _symbol("GPUModelRunner")
    if getattr(runner_cls, "_draftscope_hooked", False):
        return
    sample, dummy, shutdown = runner_cls.sample, runner_cls._dummy_sampler_run, runner_cls.shutdown

    @functools.wraps(sample)
    def wrapped_sample(
        self: Any, hidden_states: Any, input_batch: Any, grammar_output: Any, *a: Any, **kw: Any
    ):
        token = _STEP.set(Step(self, input_batch, grammar_output))
        try:
            return sample(self, hidden_states, input_batch, grammar_output, *a, **kw)
        finally:
            _STEP.reset(token)

    @functools.wraps(dummy)
    def wrapped_dummy(self: Any, hidden_states: Any, *a: Any, **kw: Any):
        token = _STEP.set(Step(self))
        try:
            return dummy(self, hidden_states, *a, **kw)
        finally:
            _STEP.reset(token)

    @functools.wraps(shutdown)
    def wrapped_shutdown(self: Any, *a: Any, **kw: Any):
        if _PLUGIN is not None:
            _PLUGIN.close()  # before the runner releases its GPU tensors: the last counter read needs CUDA
        return shutdown(self, *a, **kw)

    runner_cls.sample = wrapped_sample
    runner_cls._dummy_sampler_run = wrapped_dummy
    runner_cls.shutdown = wrapped_shutdown
    runner_cls._draftscope_hooked = True


# --- prerequisites ----------------------------------------------------------------------------------------------


def head_missing(
    processor: Any, lm_head: Any, hidden: torch.Tensor, embedding_bias: Any, *, cuda: bool = True
) -> list[str]:
    """What about the model's head breaks the certificate's reference semantics (docs/review/head.md). On CUDA the head
    must be bfloat16 (an fp32 GEMM there may run in TF32); on a CPU float32 is certified as well (fp32 output)."""
    missing = []
    weight = lm_head.weight
    if processor.logits_as_input:
        missing.append("the model passes logits, not hidden states, to its LogitsProcessor")
    if processor.scale != 1.0:
        missing.append(f"the logits are scaled (scale={processor.scale})")
    if processor.soft_cap is not None:
        missing.append(f"the logits are soft-capped (soft_cap={processor.soft_cap})")
    if embedding_bias is not None:
        missing.append("the head has an embedding bias")
    if processor.head_dtype is not None and processor.head_dtype != hidden.dtype:
        missing.append(f"head_dtype {processor.head_dtype} differs from the hidden states' {hidden.dtype}")
    if lm_head.tp_size != 1:
        missing.append(f"the head is split over {lm_head.tp_size} tensor-parallel ranks")
    method = type(lm_head.quant_method).__name__
    if method not in DENSE_HEAD_METHODS:
        missing.append(f"the head is quantized ({method})")
    dtypes = (torch.bfloat16,) if cuda else (torch.bfloat16, torch.float32)
    if weight.dim() != 2 or weight.dtype not in dtypes or hidden.dtype != weight.dtype:
        wanted = "bfloat16" if cuda else "bfloat16 or float32 (both alike)"
        missing.append(f"head weight {weight.dtype} / hidden states {hidden.dtype}: {wanted} is required")
    elif processor.org_vocab_size > weight.shape[0] or weight.shape[1] != hidden.shape[-1]:
        missing.append(f"head weight shape {tuple(weight.shape)} does not fit the processor")
    return missing


def runner_missing(runner: Any) -> list[str]:
    """Engine-wide features whose sampling is not a plain argmax of the head's logits."""
    missing = []
    vllm_config, model_state, spec, sampler = (
        runner.vllm_config,
        runner.model_state,
        runner.speculative_config,
        runner.sampler,
    )
    if runner.batch_sharder is not None:
        missing.append("batch-sharded sampling")
    if model_state.num_new_sampled_tokens_per_step != 1:
        missing.append(f"{model_state.num_new_sampled_tokens_per_step} sampled tokens per step")
    if spec is not None and spec.rejection_sample_method != STANDARD_REJECTION:
        missing.append(f"rejection_sample_method={spec.rejection_sample_method!r}")
    if vllm_config.watermark_config is not None:
        missing.append("watermarking")
    rejection = runner.rejection_sampler
    if sampler is None:
        missing.append("no sampler on this rank")
    elif type(sampler).__name__ != "Sampler" or type(rejection).__name__ not in (
        "RejectionSampler",
        "NoneType",
    ):
        missing.append(f"a custom sampler ({type(sampler).__name__}, {type(rejection).__name__})")
    elif sampler.trace_replay_state is not None or sampler.return_sampling_mask:
        missing.append("trace replay or sampling masks")
    return missing


# --- per step ---------------------------------------------------------------------------------------------------

_INELIGIBLE = (  # in the order they are reported
    "non-greedy sampling",
    "penalties, logit bias, bad words, min_tokens, allowed ids, thinking budget or custom processors",
    "logprobs",
    "structured output",
)


def ineligible_reasons(runner: Any, batch: Any, grammar: Any) -> list[str]:
    """Host-side (no sync): why some request of the batch must take the dense head; empty when none must."""
    sampler = runner.sampler
    n = batch.num_reqs
    idx = batch.idx_mapping_np[:n]
    states, token_ids_state = sampler.sampling_states, sampler.logprob_token_ids_state
    flags = [
        states.temperature.np[idx] != 0.0,
        np.asarray(sampler.needs_logits_processing)[idx],
        (states.num_logprobs[idx] != _symbol("NO_LOGPROBS")) | (token_ids_state.num_token_ids.np[idx] > 0),
    ]
    structured = set(grammar.structured_output_request_ids) if grammar is not None else set()
    flags.append(np.array([r in structured for r in batch.req_ids[:n]], dtype=bool))
    return [reason for reason, flag in zip(_INELIGIBLE, flags, strict=True) if np.any(flag)]


@dataclass(frozen=True)
class Layout:
    """Per logits row: its request and the draft token it is checked against (−1 on each request's last row)."""

    request: torch.Tensor
    draft: torch.Tensor
    local_pos: torch.Tensor
    requests: int


def layout(batch: Any, rows: int, device: torch.device) -> Layout | None:
    """From the batch as vLLM's rejection sampler reads it: row i of a request is checked against the input token
    of row i+1 (`input_ids[logits_indices[i+1]]`); a row followed by a request start is that request's last.
    vLLM turns some drafts into −1 placeholders (prefill); treating them as real drafts can only extend the
    prefix walk, so the relevant rows found here include vLLM's."""
    local_pos, indices = batch.expanded_local_pos, batch.logits_indices
    if rows == 0 or local_pos.shape[0] != rows or indices.shape[0] != rows:
        return None
    local_pos = local_pos.to(device=device, dtype=torch.long)
    first = local_pos == 0
    tokens = batch.input_ids[indices].to(device=device, dtype=torch.long)
    last = torch.ones_like(first)
    last[:-1] = first[1:]
    draft = torch.where(last, torch.full_like(tokens, NO_DRAFT), torch.roll(tokens, -1))
    request = torch.cumsum(first.to(torch.long), 0) - 1
    return Layout(request, draft, local_pos, int(batch.num_reqs))


def _graph_head(
    head: QuantizedHead,
    impl: select.Implementation,
    settings: switch.Settings,
    counters: HeadCounters,
    triggers: torch.Tensor,
) -> Any:
    """The captured conditional head over the plugin's INT8 head, Triton stages and device counters (graphs are
    captured per row bucket on first use)."""
    # lazy: the graph module's CUDA pieces, only on the cuda-graph implementation
    from draftscope.head.graph import ConditionalHead

    return ConditionalHead(
        head.weight,
        k=settings.k,
        max_requests=settings.max_rows,
        quantized=head,
        stages=select.stages(impl, head.weight.device, capturable=True),
        counters=counters,
        triggers=triggers,
    )


class _Plugin:
    """The per-process state: settings, the INT8 head once active, counters, the status file."""

    def __init__(self, settings: switch.Settings) -> None:
        self.settings = settings
        self.state = "pending"  # → active | stock | error
        self.reason: str | None = None
        self.facts: dict[str, Any] = {}
        self.head: QuantizedHead | None = None
        self.stages: select.Stages | None = None  # the eager implementations' certify stages
        self.graph_head: Any = None  # graph.ConditionalHead on the cuda-graph implementation
        self.counters: HeadCounters | None = None
        self.trigger_positions: torch.Tensor | None = None  # device histogram: row within its request
        self.trigger_host: list[int] = []
        self.routing: dict[str, Any] = {
            "steps": 0,
            "too_many_rows": 0,
            "layout_mismatch": 0,
            "ineligible": {},
        }
        self.seconds = {"activation": 0.0, "certify_host": 0.0}
        self.hooked = False
        self.closed = False

    # the processor's side

    def processor_created(self) -> None:
        """Called from each new PrefixLogitsProcessor (in the process building a model)."""
        if self.hooked or self.state != "pending":
            return
        self.hooked = True
        vllm_config = _symbol("get_current_vllm_config")()
        if not vllm_config.use_v2_model_runner:
            if torch.cuda.is_available():
                self.stay_stock(V1_RUNNER + " on CUDA (the V1 hooks serve vLLM's CPU engine)")
                return
            # vLLM's CPU engine 0.32 runs the V1 CPUModelRunner: its own two hooks (vllm_v1).
            try:
                vllm_v1.install_runner_hooks(vllm_v1.runner_class(), _STEP, lambda r, h: Step(r, v1=h))
            except (ImportError, AttributeError) as exc:
                self.stay_stock(f"{V1_RUNNER}, and its V1 hooks do not fit this vLLM: {exc}")
                return
            self.facts["runner"] = "v1"
            return
        install_runner_hooks()

    def logits(
        self,
        processor: Any,
        lm_head: Any,
        hidden: torch.Tensor,
        bias: Any,
        step: Step,
        dense: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        if not self._is_target(processor, step.runner):
            return dense()
        with torch.inference_mode():
            if self.state == "pending":
                self.activate(processor, lm_head, hidden, bias, step.runner, dense)
            if self.state != "active":
                return dense()
            with serving.reference_contract(hidden):
                if step.profile:
                    return dense()
                return self._step(processor, hidden, step, dense)

    def _is_target(self, processor: Any, runner: Any) -> bool:
        if processor._draftscope_target is None:
            processor._draftscope_target = any(m is processor for m in runner.model.modules())
        return bool(processor._draftscope_target)

    def activate(
        self,
        processor: Any,
        lm_head: Any,
        hidden: torch.Tensor,
        bias: Any,
        runner: Any,
        dense: Callable[..., torch.Tensor],
    ) -> None:
        started = time.perf_counter()
        settings = self.settings
        weight = lm_head.weight
        try:
            device = serving.probe_device(hidden)
            self.facts["device"] = asdict(device)
            impl = select.select(device, max_rows=settings.max_rows)
            self.facts["implementation"] = impl.record()
            v1 = self.facts.get("runner") == "v1"
            try:
                missing = head_missing(processor, lm_head, hidden, bias, cuda=device.cuda)
                missing += vllm_v1.runner_missing(runner) if v1 else runner_missing(runner)
            except AttributeError as exc:  # another vLLM than the one the names were checked against
                self.stay_stock(f"this vLLM's head or runner lacks a name the plugin reads: {exc}")
                return
            if not missing and settings.mode == "prefix":
                vocab, width = int(processor.org_vocab_size), int(weight.shape[1])
                groups = 1 if settings.group_size is None else max(1, width // settings.group_size)
                need = serving.needed_bytes(vocab, width, groups, settings.max_rows)
                self.facts["memory"] = {"needed_bytes": need, "free_bytes": device.free_bytes}
                if device.cuda:
                    missing += serving.device_missing(device, need)
            elif not missing and device.cuda:
                missing += serving.device_missing(device, 0)
            if missing:
                self.stay_stock("; ".join(missing))
                return
            if settings.mode == "prefix":
                before = torch.cuda.memory_allocated(hidden.device) if hidden.is_cuda else 0
                try:
                    head = serving.build_head(weight[: processor.org_vocab_size], settings.group_size)
                except ValueError as exc:  # non-finite weights, a group size that does not divide D
                    self.stay_stock(f"the INT8 head cannot be built: {exc}")
                    return
                after = torch.cuda.memory_allocated(hidden.device) if hidden.is_cuda else None
                self.facts["memory"].update(
                    added_bytes=head.bytes_int8,
                    allocated_delta_bytes=None if after is None else after - before,
                )
                self.facts["head"] = {
                    "vocab": head.vocab,
                    "hidden": head.hidden,
                    "groups": head.groups,
                    "group_size": head.group_size,
                    "dtype": str(weight.dtype).removeprefix("torch."),
                }
                self.stages = select.stages(impl, hidden.device)
                with serving.reference_contract(hidden):
                    check = serving.startup_check(
                        head,
                        dense,
                        rows=settings.max_rows,
                        k=settings.k,
                        out_dtype=weight.dtype,
                        stages=self.stages,
                    )
                self.facts["startup_check"] = check
                if check["disagreements"]:
                    del head
                    self.stay_stock(
                        f"startup check: {check['disagreements']} of {check['certified']} certified rows "
                        "disagree with the dense head"
                    )
                    return
                self.head = head
                self.trigger_host = [0] * (settings.max_rows + 1)
            # Normal (not inference-mode) tensors: vLLM's inference mode may be off where they are read.
            with torch.inference_mode(False):
                self.counters = HeadCounters(hidden.device, settings.read_every)
                if self.head is not None:
                    self.trigger_positions = torch.zeros(
                        settings.max_rows + 1, dtype=torch.int64, device=hidden.device
                    )
                    if impl.graph:
                        captured = time.perf_counter()
                        self.graph_head = _graph_head(
                            self.head, impl, settings, self.counters, self.trigger_positions
                        )
                        with serving.reference_contract(hidden):
                            buckets = self.graph_head.capture_all(settings.max_rows)
                        self.facts["graph"] = {
                            "buckets": buckets,
                            "capture_seconds": round(time.perf_counter() - captured, 6),
                        }
            self.state = "active"
            logger.warning(
                "draftscope prefix head active (mode %s): %s", settings.mode, self.facts.get("memory")
            )
        except torch.OutOfMemoryError as exc:  # the allocator refused; nothing sticky: release and stay stock
            self.head = None
            self.stay_stock(f"out of GPU memory while building the INT8 head: {str(exc)[:200]}")
            return
        except BaseException as exc:  # CUDA errors (and bugs) stop the run, after the status says why
            self.state, self.reason = "error", f"{type(exc).__name__}: {str(exc)[:500]}"
            self.write()
            raise
        finally:
            self.seconds["activation"] += time.perf_counter() - started
        self.write()

    def _step(self, processor: Any, hidden: torch.Tensor, step: Step, dense: Callable[..., torch.Tensor]):
        counters = self.counters
        assert counters is not None
        rows = int(hidden.shape[0])
        self.routing["steps"] += 1
        if self.settings.mode == "dense":
            out = dense()
            counters.add(calls=1, rows=rows, dense_calls=1, dense_calls_rowwise=1, dense_calls_prefix=1)
            return self._tick(out)
        runner, batch = step.runner, step.batch
        if step.v1 is not None:
            why = vllm_v1.ineligible_reasons(runner)
            found = vllm_v1.layout(runner, step.v1, rows, hidden.device) if not why else None
            plan = Layout(*found) if found is not None and rows <= self.settings.max_rows else None
        else:
            why = ineligible_reasons(runner, batch, step.grammar)
            plan = layout(batch, rows, hidden.device) if not why and rows <= self.settings.max_rows else None
        if plan is None:
            if why:
                for reason in why:
                    self.routing["ineligible"][reason] = self.routing["ineligible"].get(reason, 0) + 1
            else:
                self.routing["too_many_rows" if rows > self.settings.max_rows else "layout_mismatch"] += 1
            out = dense()
            counters.add(calls=1, rows=rows, dense_calls=1, dense_calls_rowwise=1, dense_calls_prefix=1)
            return self._tick(out)

        started = time.perf_counter()
        head = self.head
        assert head is not None and self.trigger_positions is not None
        vocab, dtype = int(processor.org_vocab_size), head.weight.dtype
        if self.graph_head is not None:
            # One replay: coarse → top-K → refine → certify → prefix rule, the dense head in the IF node, the
            # counters and trigger rows added on the device. No host sync: the tokens are final either way.
            replay = self.graph_head(hidden, plan.draft, plan.request, plan.requests, plan.local_pos)
            if self.settings.shadow:
                wrong = replay.certified & (replay.tokens != dense().argmax(dim=-1))
                counters.add(shadow_calls=1, shadow_disagreements=wrong.sum())
            self.seconds["certify_host"] += time.perf_counter() - started
            return self._tick(serving.argmax_equivalent(replay.tokens.clamp(0, head.vocab - 1), vocab, dtype))
        cert = certify(
            head,
            hidden,
            plan.draft,
            k=self.settings.k,
            out_dtype=dtype,
            **self.stages.certify_kwargs(head, hidden),
        )
        prefix = prefix_decision(
            cert.certified, cert.tokens, plan.draft, plan.request, requests=plan.requests
        )
        rowwise = rowwise_decision(cert.certified, plan.request, requests=plan.requests)
        counters.add(
            calls=1,
            rows=rows,
            certified=cert.certified.sum(),
            uncertified_relevant=(prefix.relevant & ~cert.certified).sum(),
            uncertified_irrelevant=(~prefix.relevant & ~cert.certified).sum(),
            dense_calls=prefix.need_dense.to(torch.int64),
            dense_calls_rowwise=rowwise.need_dense.to(torch.int64),
            dense_calls_prefix=prefix.need_dense.to(torch.int64),
            ties=(cert.ties * cert.certified).sum(),
        )
        fired = prefix.trigger >= 0
        self.trigger_positions.index_put_(
            (plan.local_pos[prefix.trigger.clamp(min=0)].clamp(max=self.settings.max_rows),),
            fired.to(torch.int64),
            accumulate=True,
        )
        reference = dense() if self.settings.shadow else None
        if reference is not None:
            wrong = cert.certified & (cert.tokens != reference.argmax(dim=-1))
            counters.add(shadow_calls=1, shadow_disagreements=wrong.sum())
        need = bool(prefix.need_dense)  # the step's one host sync: which logits to hand to the sampler
        self.seconds["certify_host"] += time.perf_counter() - started
        if need:
            out = reference if reference is not None else dense()
        else:
            # Uncertified rows here lie after their request's stop and are never read; a NaN row's "winner" can
            # be the out-of-range index V, so clamp before using it as an index.
            tokens = cert.tokens.clamp(0, head.vocab - 1)
            out = serving.argmax_equivalent(tokens, vocab, dtype)
        return self._tick(out)

    def _tick(self, out: torch.Tensor) -> torch.Tensor:
        assert self.counters is not None
        self.counters.step()
        if self.counters.steps % self.counters.read_every == 0:  # HeadCounters.step() just read them
            self._read_triggers()
            self.write()
        return out

    def _read_triggers(self) -> None:
        if self.trigger_positions is not None:
            counts = self.trigger_positions.tolist()
            self.trigger_positions.zero_()
            self.trigger_host = [a + int(b) for a, b in zip(self.trigger_host, counts, strict=True)]

    # status

    def stay_stock(self, reason: str) -> None:
        self.state, self.reason = "stock", reason
        logger.warning("draftscope prefix head not active, the stock LogitsProcessor stays: %s", reason)
        self.write()

    def status(self) -> dict[str, Any]:
        settings = self.settings
        counters = self.counters
        return {
            "state": self.state,
            "reason": self.reason,
            "mode": settings.mode,
            "shadow": settings.shadow,
            "settings": {
                "k": settings.k,
                "group_size": settings.group_size,
                "read_every": settings.read_every,
                "max_rows": settings.max_rows,
            },
            "pid": os.getpid(),
            "reference_contract": serving.REFERENCE_CONTRACT if self.state == "active" else None,
            **self.facts,
            "counters": dict(counters.host) if counters is not None else None,
            "counter_reads": counters.reads if counters is not None else 0,
            "routing": self.routing,
            "fallback_trigger_positions": self.trigger_host or None,
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
            "final": self.closed,
            "updated_unix": round(time.time(), 3),
        }

    def write(self) -> None:
        path = self.settings.status_path
        if path is None:
            return
        try:
            switch.write_status(path, self.status())
        except OSError as exc:  # the status is a record, not a reason to stop serving
            logger.warning("draftscope prefix head: cannot write %s: %s", path, exc)

    def close(self) -> None:
        """Final counter read and status (runner shutdown, atexit or a multiprocessing finalizer; once)."""
        if self.closed:
            return
        self.closed = True
        if self.state == "active" and self.counters is not None:
            try:
                self.counters.read()
                self._read_triggers()
            except Exception as exc:  # at interpreter exit CUDA may already be gone: keep the last read
                self.facts["final_read_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if self.state != "pending":
            self.write()
