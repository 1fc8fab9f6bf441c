"""The vLLM backend's engine: the pinned INT4 target with its DFlash2 draft (or any hub target, plain), greedy,
batch one.

Everything the worker hands to vLLM is built by `config.engine_args`, a pure function of the config and the preset
(no torch, no vLLM), so the dry run can print it and the unit tests can check it. The engine imports vLLM lazily,
inside the vllm image.

How it measures (vLLM 0.33, V1 engine):
- Requests go through `LLMEngine.add_request` + `LLMEngine.step()` with `RequestOutputKind.DELTA`, so every
  step returns only the tokens that step produced. Each token is stamped with `perf_counter` when its step's
  output reaches this process; tokens from one verification step share that step's time, as in the kit's own
  speculative loop. `request_seconds` runs from just before `add_request` to the step that delivers the last
  token: prefill and engine overhead included, tokenization not (inputs are token ids).
- Acceptance: `per_request_spec_decode_metrics="detailed"` makes the engine return, with the finished request,
  the accepted draft count of every verification step; each step's length is that count + 1 (the bonus or
  correction token), as vLLM counts it. The prefill step (which drafts nothing) is not a verification step,
  and a step cut short by EOS or the token budget keeps the engine's count. As a cross-check the spec-decode
  counters (`vllm:spec_decode_num_drafts`, `…_num_draft_tokens`, `…_num_accepted_tokens`) are read before and
  after each request through `LLMEngine.get_metrics()`; their delta goes to the record's `extra`.

Every vLLM name used here is listed in the constants below (the values passed to vLLM, in `config.py`); the
contract test (`tests/contract/test_vllm_backend.py`) checks each one against the pinned release's source.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from draftscope.bench.backends.common import chat_token_ids, need
from draftscope.bench.backends.vllm import BACKEND, cpu
from draftscope.bench.backends.vllm.config import (
    OOM_MARKERS,
    PLACEHOLDERS,
    ModelDirs,
    engine_args,
    is_kit_model,
    sampling_kwargs,
)
from draftscope.core.errors import UserError
from draftscope.core.presets import ExperimentConfig, ModelPreset, resolve_draft, resolve_target

IMAGE = BACKEND.image  # named in "install … or run in image …" when vLLM is missing
PINNED_VERSION = "0.33.0"  # the release this backend (and `config.py`) is written and contract-tested against

TIMING_SOURCE = (
    "vllm streamed outputs (LLMEngine.step with RequestOutputKind.DELTA; perf_counter when each step's tokens "
    "reach the host; the tokens of one verification step share its time)"
)
ACCEPTANCE_SOURCE = (
    "per-request spec-decode metrics (per_request_spec_decode_metrics='detailed': accepted drafts per "
    "verification step, + 1); cross-checked against the delta of the engine's spec-decode counters"
)

# --- the contract with vLLM 0.33.0 (each name is checked against the release by the contract test) ----------

# Where each vLLM object the backend uses is defined; `_symbol(name)` is the only way the backend gets one.
SYMBOLS: Mapping[str, str] = {
    "EngineArgs": "vllm",
    "LLMEngine": "vllm",
    "SamplingParams": "vllm",
    "TokensPrompt": "vllm",
    "RequestOutputKind": "vllm.sampling_params",
    "current_platform": "vllm.platforms",
}
# Attributes read on each kind of vLLM object. The code names its variables after these kinds (`engine`,
# `out`, `completion`, `spec`, `metric`, `platform`, `capability`) so that the contract test can check that
# nothing outside these lists is read.
ENGINE_METHODS = (
    "from_engine_args",
    "add_request",
    "step",
    "has_unfinished_requests",
    "get_metrics",
    "get_tokenizer",
)
ADD_REQUEST_PARAMS = ("request_id", "prompt", "params")
REQUEST_OUTPUT_ATTRS = ("outputs", "finished", "num_cached_tokens")
COMPLETION_ATTRS = ("token_ids", "finish_reason", "stop_reason", "spec_decode_metrics")
SPEC_METRICS_ATTRS = ("histogram", "num_draft_tokens", "per_step_accepted", "per_step_drafted")
METRIC_ATTRS = ("name", "value")
PLATFORM_METHODS = ("get_device_capability",)
CAPABILITY_ATTRS = ("major", "minor")
TOKENIZER_METHODS = ("apply_chat_template",)
TOKENS_PROMPT_KEYS = ("prompt_token_ids",)
OUTPUT_KIND = "DELTA"  # a RequestOutputKind member: each step returns only its new tokens
FINISH_STOP, FINISH_LENGTH = "stop", "length"  # CompletionOutput.finish_reason strings we map
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
# What this process sees when vLLM's engine core process fails (at start-up, or later); the cause, OOM
# included, is printed by that process into the same log.
ENGINE_PROCESS_FAILURES = ("Engine core initialization failed", "EngineCore encountered an issue")


# --- what comes back, pure ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Stream:
    """One request's streamed outputs as the host saw them."""

    token_ids: list[int]
    token_times: list[float]  # seconds since submission at which each token reached the host
    request_seconds: float  # submission → the step that delivered the last token
    completion: Any  # the final CompletionOutput (finish reason, per-request spec-decode metrics)
    prefix_cached_tokens: int | None  # from the first output: 0 when the prefix cache is off, as it must be


def stream_request(
    engine: Any, request_id: str, prompt: Any, params: Any, *, clock: Callable[[], float] = time.perf_counter
) -> Stream:
    """Submit one request and step the engine until it finishes, stamping tokens as they arrive."""
    tokens: list[int] = []
    times: list[float] = []
    completion = None
    cached: int | None = None
    now = 0.0
    start = clock()
    engine.add_request(request_id=request_id, prompt=prompt, params=params)
    while completion is None:
        outputs = engine.step()
        now = clock() - start
        if not outputs and not engine.has_unfinished_requests():
            raise RuntimeError(f"vLLM dropped request {request_id} without finishing it")
        # Batch one: the only request in flight is this one, so every output belongs to it.
        for out in outputs:
            if cached is None:
                cached = out.num_cached_tokens
            (delta,) = out.outputs  # n = 1
            new = [int(t) for t in delta.token_ids]
            tokens.extend(new)
            times.extend([now] * len(new))
            if out.finished:
                completion = delta
    return Stream(tokens, times, now, completion, cached)


def finish_reason(completion: Any, generated: int, *, max_new_tokens: int, ignore_eos: bool) -> str:
    """vLLM's finish reason in the record's terms (record.schema.json)."""
    reason = str(completion.finish_reason)
    if reason == FINISH_LENGTH:
        return "fixed_tokens" if ignore_eos and generated == max_new_tokens else "length"
    if reason == FINISH_STOP:
        # No stop strings are set, so a stop is the EOS token or a generation-config EOS id (an int reason).
        return "stop" if isinstance(completion.stop_reason, str) else "eos"
    raise RuntimeError(f"vLLM ended the request with finish reason '{reason}'")


def acceptance(
    completion: Any, k: int, before: Mapping[str, int] | None, after: Mapping[str, int] | None
) -> tuple[list[int] | None, dict[str, Any]]:
    """Per-step acceptance lengths from the request's own metrics, and the counter cross-check for `extra`."""
    extra: dict[str, Any] = {}
    lengths: list[int] | None = None
    spec = completion.spec_decode_metrics
    if spec is not None:
        steps = sum(spec.histogram)
        accepted = list(spec.per_step_accepted)
        drafted = list(spec.per_step_drafted)
        if len(accepted) == steps:  # the detailed level: one entry per verification step
            lengths = [a + 1 for a in accepted]
        extra["verification_steps"] = steps
        extra["draft_tokens_total"] = spec.num_draft_tokens
        # histogram[i] = the steps that accepted i drafts, at every metrics level
        extra["accepted_tokens_total"] = sum(i * n for i, n in enumerate(spec.histogram))
        if any(d != k for d in drafted):
            extra["draft_tokens_by_step"] = drafted  # fewer proposals than k, e.g. near the length limit
    if before is not None and after is not None:
        delta = {name: after.get(name, 0) - before.get(name, 0) for name in SPEC_COUNTERS}
        drafts, accepted_tokens = delta[SPEC_COUNTERS[0]], delta[SPEC_COUNTERS[2]]
        extra["spec_decode_counters"] = delta
        extra["counter_acceptance_length"] = 1 + accepted_tokens / drafts if drafts else None
        if spec is not None:
            # The request's own figures against the engine's counters (batch one: the delta is this request's).
            extra["counters_agree"] = (drafts, delta[SPEC_COUNTERS[1]], accepted_tokens) == (
                extra["verification_steps"],
                extra["draft_tokens_total"],
                extra["accepted_tokens_total"],
            )
    return lengths, extra


def spec_counters(metrics: Sequence[Any]) -> dict[str, int]:
    """The spec-decode counters from `LLMEngine.get_metrics()`, summed over engines."""
    totals = dict.fromkeys(SPEC_COUNTERS, 0)
    for metric in metrics:
        if metric.name in totals:
            totals[metric.name] += int(metric.value)
    return totals


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc`, or an exception it was raised from, says the GPU ran out of memory."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ == "OutOfMemoryError":
            return True
        text = str(current)
        if any(marker in text for marker in OOM_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False


class OutOfMemoryError(RuntimeError):
    """The GPU ran out of memory inside vLLM. Named like torch's error so that the entry point reports it as the
    run's failure reason (never answered by another device, model or quantization)."""


def _engine_failure(exc: Exception, config: ExperimentConfig) -> Exception:
    if is_out_of_memory(exc):
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if config.device == "cpu":
            return OutOfMemoryError(
                f"{first} (CPU engine); fix: free host memory, or set VLLM_CPU_KVCACHE_SPACE (GiB) lower"
            )
        return OutOfMemoryError(
            f"{first} (gpu_memory_utilization={config.memory_fraction}); fix: free the GPU, raise "
            "--memory-fraction, lower vllm.max_model_len, or use a larger GPU"
        )
    if any(marker in str(exc) for marker in ENGINE_PROCESS_FAILURES):
        return RuntimeError(
            "vLLM's engine core process failed; its own error (for example out of GPU memory) is earlier in "
            "this step's log"
        )
    return exc


@contextlib.contextmanager
def _reported(config: ExperimentConfig) -> Iterator[None]:
    """Re-raise an engine failure under a name the run's failure reason can use."""
    try:
        yield
    except Exception as exc:
        failure = _engine_failure(exc, config)
        if failure is exc:
            raise
        raise failure from exc


# --- the backend --------------------------------------------------------------------------------------------


def _symbol(name: str) -> Any:
    """A vLLM object from the module `SYMBOLS` names for it."""
    return getattr(need(SYMBOLS[name], image=IMAGE), name)


class VllmBackend:
    name = BACKEND.name

    def __init__(self) -> None:
        self._staged: tempfile.TemporaryDirectory[str] | None = None
        self.engine: Any = None
        self.tokenizer: Any = None
        self.config: ExperimentConfig | None = None
        self.k: int | None = None
        self.facts: dict[str, Any] = {}
        self._ids = itertools.count()

    def load(self, config: ExperimentConfig, preset: ModelPreset) -> None:
        image = BACKEND.image_for(config.device)
        vllm = need("vllm", image=image)
        if config.device not in BACKEND.devices:
            raise UserError(
                "the vLLM backend runs on cuda or cpu",
                field="device",
                value=config.device,
                fix="use one of those",
            )
        cpu_facts: dict[str, Any] = {}
        models: ModelDirs | None = None
        capability: tuple[int, int] | None = None
        if config.device == "cpu":
            # vLLM reads the tokenizer from the model folder; the folders live as long as this engine.
            self._staged = tempfile.TemporaryDirectory(prefix="draftscope-vllm-tiny-")
            models = cpu.stage(self._staged.name, draft=config.draft == "tiny")
            cpu_facts = {
                "engine": "cpu",
                "staged_from": "the shipped tiny models (SHA-256 checked against the tiny preset)",
                "kv_cache_space": cpu.kv_cache_space(),  # before the engine: its config reads it
            }
        else:
            capability = _capability()
        engine_version = cpu.engine_distribution(str(vllm.__version__))
        args = engine_args(config, preset, capability=capability, models=models)
        EngineArgs, LLMEngine = _symbol("EngineArgs"), _symbol("LLMEngine")
        with _reported(config):
            # `LLMEngine` rather than `LLM`: its step loop hands over each step's tokens as they arrive.
            self.engine = LLMEngine.from_engine_args(EngineArgs(**args))
        self.tokenizer = self.engine.get_tokenizer()
        self.config = config
        spec_args = args.get("speculative_config")
        self.k = spec_args["num_speculative_tokens"] if spec_args else None
        target = resolve_target(config, preset)
        draft = resolve_draft(config, preset)
        kit = is_kit_model(config)
        self.facts = {
            "backend": self.name,
            "device": config.device,
            "dtype": args["dtype"],
            "target": "tiny (kit-built)" if kit else (target.display() if target else None),
            "draft": "tiny (kit-built)" if config.draft == "tiny" else (draft.display() if draft else None),
            "draft_tokens": self.k,
            "timing_source": TIMING_SOURCE,
            "acceptance_source": ACCEPTANCE_SOURCE if spec_args else None,
            "capability": list(capability) if capability else None,
            # The staged folders by placeholder: no path of this machine enters the run's records.
            "engine_args": engine_args(config, preset, capability=capability, models=PLACEHOLDERS)
            if models
            else args,
            "experimental_prefix": config.experimental_prefix,
            # `vllm.__version__`, not the distribution's metadata: the CPU build is the distribution `vllm-cpu`.
            "vllm_version": engine_version["version"],
            "vllm_engine": engine_version,
            "contract_version": PINNED_VERSION,
            **({"cpu": cpu_facts} if cpu_facts else {}),
        }

    def encode(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return chat_token_ids(self.tokenizer, messages)

    def generate(self, input_ids: list[int], *, max_new_tokens: int, ignore_eos: bool):
        # lazy: torch and transformers, in the vLLM image at run time
        from draftscope.decode import Generation

        params = _symbol("SamplingParams")(
            **sampling_kwargs(max_new_tokens, ignore_eos),
            output_kind=getattr(_symbol("RequestOutputKind"), OUTPUT_KIND),
        )
        prompt = _symbol("TokensPrompt")(prompt_token_ids=[int(i) for i in input_ids])
        request_id = f"draftscope-{next(self._ids)}"
        with _reported(self.config):
            before = spec_counters(self.engine.get_metrics()) if self.k else None
            stream = stream_request(self.engine, request_id, prompt, params)
            after = spec_counters(self.engine.get_metrics()) if self.k else None
        n = len(stream.token_ids)
        finish = finish_reason(stream.completion, n, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
        lengths, extra = acceptance(stream.completion, self.k, before, after) if self.k else (None, {})
        extra["prefix_cached_tokens"] = stream.prefix_cached_tokens
        kwargs: dict[str, Any] = {}
        # `extra` (record.schema.json's free-form object) travels only where Generation has the field.
        if "extra" in {f.name for f in dataclasses.fields(Generation)}:
            kwargs["extra"] = extra
        return Generation(
            stream.token_ids,
            stream.token_times,
            stream.request_seconds,
            finish,
            lengths,
            self.k,
            **kwargs,
        )

    def synchronize(self) -> None:
        """Nothing to wait for: a step's outputs are on the host when `step()` returns them."""


def _capability() -> tuple[int, int]:
    """The GPU's compute capability through NVML (vLLM's platform), without creating a CUDA context here."""
    platform = _symbol("current_platform")
    capability = platform.get_device_capability(0)
    if capability is None:
        raise UserError(
            "no CUDA device is visible",
            field="device",
            value="cuda",
            fix="run on an NVIDIA GPU host with the GPU passed to the container (invoke doctor)",
        )
    return (int(capability.major), int(capability.minor))
