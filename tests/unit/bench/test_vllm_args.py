"""The vLLM backend's pure parts: engine arguments, sampling fields, streamed outputs, acceptance, OOM reporting.

vLLM cannot run here (no NVIDIA GPU), so the objects it returns are stood in for by fakes that carry exactly the
attributes the backend declares (`REQUEST_OUTPUT_ATTRS`, …); the contract test checks those declarations against
the pinned release.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from draftscope.bench.backends.vllm import backend as V
from draftscope.bench.backends.vllm import config as C
from draftscope.core import presets as P
from draftscope.core.errors import UserError

INT4_PIN = "0123456789abcdef0123456789abcdef01234567"  # stands in for a checked commit of the INT4 checkpoint
DFLASH2 = "z-lab/Qwen3.8-27B-DFlash2"
DFLASH2_PIN = "50307d4c4cde6860d4eee73e2547cd786fe8e8a4"


def int4_config(**overrides):
    """The vllm-int4-dflash2 preset with the INT4 checkpoint pinned through --model/--revision."""
    return P.load_experiment(
        "vllm-int4-dflash2", {"model": "RedHatAI/Qwen3.8-27B-INT4", "revision": INT4_PIN, **overrides}
    )


def args_for(config, capability=(9, 0), **kwargs):
    return C.engine_args(config, P.load_model_preset(config.model_preset), capability=capability, **kwargs)


# --- engine_args ------------------------------------------------------------------------------------------


def test_int4_dflash2_engine_args():
    args = args_for(int4_config())
    assert args == {
        "model": "RedHatAI/Qwen3.8-27B-INT4",
        "revision": INT4_PIN,
        "tokenizer_revision": INT4_PIN,
        "trust_remote_code": False,
        "dtype": "bfloat16",
        "seed": 0,
        "gpu_memory_utilization": 0.6,
        "tensor_parallel_size": 1,
        "enforce_eager": False,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "max_model_len": 8192,
        "speculative_config": {
            "method": "dflash",
            "model": DFLASH2,
            "revision": DFLASH2_PIN,
            "num_speculative_tokens": 7,
        },
        "per_request_spec_decode_metrics": "detailed",
        "disable_custom_all_reduce": True,
        "distributed_executor_backend": "mp",
    }


def test_num_speculative_tokens_is_block_size_minus_one():
    preset = P.load_model_preset("qwen38-27b")
    assert args_for(int4_config())["speculative_config"]["num_speculative_tokens"] == (
        preset.dflash.block_size - 1
    )


def test_the_preset_int4_checkpoint_is_the_target_without_model_override():
    args = args_for(P.load_experiment("vllm-int4-dflash2"), require_pins=False)
    preset = P.load_model_preset("qwen38-27b")
    assert (args["model"], args["revision"]) == (preset.int4.repo, preset.int4.revision)


def test_an_unpinned_checkpoint_is_refused_for_a_real_run():
    config = P.load_experiment("vllm-int4-dflash2")  # the preset's INT4 checkpoint has no pinned commit
    with pytest.raises(UserError) as err:
        args_for(config)
    assert err.value.field == "revision" and "RedHatAI/Qwen3.8-27B-INT4" in err.value.message
    assert args_for(config, require_pins=False)["revision"] is None  # a dry run may still show it


def test_memory_fraction_maps_to_gpu_memory_utilization():
    assert args_for(int4_config(memory_fraction=0.42))["gpu_memory_utilization"] == 0.42


def test_hybrid_flags_for_qwen38_27b_only():
    hybrid = args_for(int4_config())
    assert hybrid["disable_custom_all_reduce"] is True
    assert hybrid["distributed_executor_backend"] == "mp"
    dense = args_for(
        P.load_experiment("vllm-int4-dflash2", {"model_preset": "qwen3-8b", "int4_dflash": False})
    )
    assert "disable_custom_all_reduce" not in dense and "distributed_executor_backend" not in dense
    assert "speculative_config" not in dense and "per_request_spec_decode_metrics" not in dense
    assert dense["model"] == "Qwen/Qwen3-8B" and dense["enable_prefix_caching"] is False


def test_a_dense_target_with_its_dflash_draft():
    config = P.load_experiment(
        "vllm-int4-dflash2",
        {
            "model_preset": "qwen3-8b",
            "int4_dflash": False,
            "draft": "z-lab/Qwen3-8B-DFlash-b16",
            "draft_revision": "9b41424b7109f9c5413454f481b09a82b85333f4",
        },
    )
    args = args_for(config)
    assert args["speculative_config"]["method"] == "dflash"
    assert args["speculative_config"]["model"] == "z-lab/Qwen3-8B-DFlash-b16"
    assert "disable_custom_all_reduce" not in args


@pytest.mark.parametrize(
    ("capability", "requested", "expected"),
    [
        ((9, 0), "auto", "bfloat16"),
        ((8, 0), "auto", "bfloat16"),
        ((7, 5), "auto", "float16"),
        ((7, 5), "bfloat16", "bfloat16"),
        (None, "float16", "float16"),
    ],
)
def test_dtype_follows_the_kit_rule(capability, requested, expected):
    assert args_for(int4_config(dtype=requested), capability=capability)["dtype"] == expected


def test_dtype_before_the_gpu_is_known_is_a_placeholder_not_a_vllm_value():
    assert args_for(int4_config(), capability=None)["dtype"] == C.DTYPE_AT_RUN_TIME


def test_optional_vllm_options_pass_through_only_when_set():
    args = args_for(int4_config(), require_pins=False)
    assert "attention_backend" not in args
    config = P.load_experiment(
        "vllm-int4-dflash2",
        {"model": "RedHatAI/Qwen3.8-27B-INT4", "revision": INT4_PIN},
        ["vllm.attention_backend=FLASH_ATTN", "vllm.enforce_eager=true", "vllm.tensor_parallel_size=2"],
    )
    args = args_for(config)
    assert args["attention_backend"] == "FLASH_ATTN"
    assert args["enforce_eager"] is True and args["tensor_parallel_size"] == 2


@pytest.mark.parametrize("model", P.model_preset_names())
@pytest.mark.parametrize("experiment", ["vllm-int4-dflash2", "vllm-int4-dflash2-prefix"])
def test_never_remote_code_and_never_prefix_caching(model, experiment):
    preset = P.load_model_preset(model)
    overrides = {"model_preset": model}
    if preset.int4 is None or preset.drafts.dflash2 is None:
        overrides |= {"int4_dflash": False, "experimental_prefix": False}
    config = P.load_experiment(experiment, overrides)
    if preset.source == "kit":
        with pytest.raises(UserError, match="staged folders"):
            args_for(config)  # the kit-built model has no hub repository: only its staged folder is loaded
        args = args_for(config, models=C.PLACEHOLDERS)
        assert args["model"] == C.PLACEHOLDERS.target
    else:
        args = args_for(config, require_pins=False)
    assert args["trust_remote_code"] is False
    assert args["enable_prefix_caching"] is False
    assert ("distributed_executor_backend" in args) == preset.architecture.is_hybrid
    assert "quantization" not in args  # read from the checkpoint's own config


def test_engine_args_are_only_for_the_vllm_backend():
    config = P.load_experiment("transformers-baseline")
    with pytest.raises(UserError, match="vLLM backend"):
        args_for(config)


def test_the_module_imports_without_torch_or_vllm():
    code = (
        "import sys, draftscope.bench.backends.vllm.backend as m; "
        "heavy = [n for n in ('torch', 'vllm', 'transformers') if n in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- sampling -----------------------------------------------------------------------------------------------


def test_sampling_is_greedy_without_logprobs_or_detokenization():
    kwargs = C.sampling_kwargs(256, ignore_eos=False)
    assert kwargs == {"n": 1, "temperature": 0.0, "max_tokens": 256, "logprobs": None, "detokenize": False}


def test_ignore_eos_only_for_fixed_tokens():
    assert C.sampling_kwargs(100, ignore_eos=True)["ignore_eos"] is True
    assert "ignore_eos" not in C.sampling_kwargs(100, ignore_eos=False)


# --- streamed outputs, with fakes that have only the declared attributes ------------------------------------


def fake(names, **values):
    assert set(values) == set(names), f"a fake must set exactly {names}"
    return SimpleNamespace(**values)


def spec_metrics(accepted, k=7):
    histogram = [0] * (k + 1)
    for a in accepted:
        histogram[a] += 1
    return fake(
        V.SPEC_METRICS_ATTRS,
        histogram=histogram,
        num_draft_tokens=k * len(accepted),
        per_step_accepted=list(accepted),
        per_step_drafted=[k] * len(accepted),
    )


def completion(tokens, finish=None, stop_reason=None, spec=None):
    return fake(
        V.COMPLETION_ATTRS,
        token_ids=tokens,
        finish_reason=finish,
        stop_reason=stop_reason,
        spec_decode_metrics=spec,
    )


def request_output(delta, finished=False):
    return fake(V.REQUEST_OUTPUT_ATTRS, outputs=[delta], finished=finished, num_cached_tokens=0)


class FakeEngine:
    """Only the methods the backend declares; `step` replays a script of per-step outputs."""

    def __init__(self, steps, counters=((0, 0, 0), (0, 0, 0))):
        self.steps = list(steps)
        self.counters = list(counters)
        self.requests = []

    def add_request(self, *, request_id, prompt, params):
        self.requests.append((request_id, prompt, params))

    def step(self):
        return self.steps.pop(0)

    def has_unfinished_requests(self):
        return bool(self.steps)

    def get_metrics(self):
        values = self.counters.pop(0)
        metrics = [
            fake(V.METRIC_ATTRS, name=n, value=v) for n, v in zip(V.SPEC_COUNTERS, values, strict=True)
        ]
        return [*metrics, fake(V.METRIC_ATTRS, name="vllm:num_requests_running", value=1)]

    def get_tokenizer(self):
        return None


def test_the_fake_engine_has_only_declared_methods():
    public = {n for n in vars(FakeEngine) if not n.startswith("_")}
    assert public <= set(V.ENGINE_METHODS)


def ticking(step=0.5):
    state = {"t": 100.0}

    def clock():
        state["t"] += step
        return state["t"]

    return clock


def test_stream_stamps_each_step_and_ends_at_the_last_token():
    final = completion([7, 8], finish="stop", spec=spec_metrics([2, 1]))
    engine = FakeEngine(
        [
            [],  # nothing yet (e.g. a step still scheduling)
            [request_output(completion([4]))],  # prefill: one token
            [request_output(completion([5, 6, 1]))],  # a verification step accepting 2 drafts
            [request_output(final, finished=True)],
        ]
    )
    stream = V.stream_request(engine, "r0", "prompt", "params", clock=ticking())
    assert engine.requests == [("r0", "prompt", "params")]
    assert stream.token_ids == [4, 5, 6, 1, 7, 8]
    assert stream.token_times == [1.0, 1.5, 1.5, 1.5, 2.0, 2.0]
    assert stream.request_seconds == 2.0
    assert stream.completion is final and stream.prefix_cached_tokens == 0


def test_a_request_the_engine_drops_is_an_error():
    engine = FakeEngine([[]])
    with pytest.raises(RuntimeError, match="without finishing"):
        V.stream_request(engine, "r0", "prompt", "params", clock=ticking())


@pytest.mark.parametrize(
    ("reason", "stop_reason", "generated", "ignore_eos", "expected"),
    [
        ("stop", None, 10, False, "eos"),
        ("stop", 151643, 10, False, "eos"),  # a generation-config EOS id
        ("stop", "</s>", 10, False, "stop"),
        ("length", None, 100, False, "length"),
        ("length", None, 100, True, "fixed_tokens"),
        ("length", None, 60, True, "length"),  # hit max_model_len before the fixed count
    ],
)
def test_finish_reasons(reason, stop_reason, generated, ignore_eos, expected):
    done = completion([], finish=reason, stop_reason=stop_reason)
    assert V.finish_reason(done, generated, max_new_tokens=100, ignore_eos=ignore_eos) == expected


def test_an_aborted_request_is_an_error():
    with pytest.raises(RuntimeError, match="abort"):
        V.finish_reason(completion([], finish="abort"), 3, max_new_tokens=100, ignore_eos=False)


def test_acceptance_lengths_from_the_request_metrics_and_the_counter_cross_check():
    done = completion([], finish="stop", spec=spec_metrics([7, 0, 3]))
    lengths, extra = V.acceptance(done, 7, {V.SPEC_COUNTERS[0]: 5}, {V.SPEC_COUNTERS[0]: 8})
    assert lengths == [8, 1, 4]
    assert extra["verification_steps"] == 3 and extra["draft_tokens_total"] == 21
    assert "draft_tokens_by_step" not in extra
    assert extra["spec_decode_counters"][V.SPEC_COUNTERS[0]] == 3


def test_counter_acceptance_length_is_one_plus_accepted_over_drafts():
    before = dict(zip(V.SPEC_COUNTERS, (10, 70, 20), strict=True))
    after = dict(zip(V.SPEC_COUNTERS, (14, 98, 32), strict=True))
    _, extra = V.acceptance(completion([], spec=None), 7, before, after)
    assert extra["counter_acceptance_length"] == 1 + 12 / 4


def test_without_per_step_detail_the_lengths_stay_unknown():
    spec = spec_metrics([2, 3])
    spec.per_step_accepted, spec.per_step_drafted = [], []  # the "summary" level
    lengths, extra = V.acceptance(completion([], spec=spec), 7, None, None)
    assert lengths is None and extra["verification_steps"] == 2


def test_short_drafts_are_recorded():
    spec = spec_metrics([1, 0])
    spec.per_step_drafted = [7, 3]
    _, extra = V.acceptance(completion([], spec=spec), 7, None, None)
    assert extra["draft_tokens_by_step"] == [7, 3]


def test_spec_counters_sum_over_engines_and_ignore_other_metrics():
    metrics = [
        fake(V.METRIC_ATTRS, name=V.SPEC_COUNTERS[2], value=3),
        fake(V.METRIC_ATTRS, name=V.SPEC_COUNTERS[2], value=4),
        fake(V.METRIC_ATTRS, name="vllm:prompt_tokens", value=99),
    ]
    assert V.spec_counters(metrics) == {V.SPEC_COUNTERS[0]: 0, V.SPEC_COUNTERS[1]: 0, V.SPEC_COUNTERS[2]: 7}


# --- out of memory ------------------------------------------------------------------------------------------


def test_out_of_memory_is_recognized_through_the_exception_chain():
    try:
        try:
            raise ValueError("No available memory for the cache blocks. Try increasing ...")
        except ValueError as inner:
            raise RuntimeError("engine failed") from inner
    except RuntimeError as outer:
        assert V.is_out_of_memory(outer)
    assert V.is_out_of_memory(type("OutOfMemoryError", (Exception,), {})("CUDA error"))
    assert not V.is_out_of_memory(RuntimeError("shape mismatch"))


def test_engine_failures_become_a_named_reason():
    config = int4_config()
    oom = V._engine_failure(ValueError("CUDA out of memory. Tried to allocate 2 GiB\nmore"), config)
    assert type(oom).__name__ == "OutOfMemoryError"  # what the entry point reports as the failure reason
    assert "gpu_memory_utilization=0.6" in str(oom) and "\n" not in str(oom)
    start = V._engine_failure(
        RuntimeError("Engine core initialization failed. See root cause above."), config
    )
    assert "earlier in this step's log" in str(start)
    dead = V._engine_failure(RuntimeError("EngineCore encountered an issue. See stack trace (above)"), config)
    assert "earlier in this step's log" in str(dead)
    other = RuntimeError("something else")
    assert V._engine_failure(other, config) is other


# --- generate, end to end over the fakes --------------------------------------------------------------------


def test_generate_builds_a_generation(monkeypatch):
    pytest.importorskip("torch")
    symbols = {
        "SamplingParams": lambda **kw: ("params", kw),
        "RequestOutputKind": SimpleNamespace(DELTA="delta"),
        "TokensPrompt": dict,
    }
    monkeypatch.setattr(V, "_symbol", symbols.__getitem__)
    final = completion([9], finish="length", spec=spec_metrics([2]))
    engine = FakeEngine(
        [[request_output(completion([4]))], [request_output(final, finished=True)]],
        counters=[(0, 0, 0), (1, 7, 2)],
    )
    backend = V.VllmBackend()
    backend.engine, backend.k, backend.config = engine, 7, int4_config()
    gen = backend.generate([1, 2, 3], max_new_tokens=2, ignore_eos=True)
    ((request_id, prompt, (_, params)),) = engine.requests
    assert request_id.startswith("draftscope-")
    assert prompt == {"prompt_token_ids": [1, 2, 3]}
    assert params["output_kind"] == "delta" and params["ignore_eos"] is True and params["temperature"] == 0
    assert gen.token_ids == [4, 9] and gen.finish_reason == "fixed_tokens"
    assert gen.acceptance_lengths == [3] and gen.draft_tokens_per_step == 7
    assert len(gen.token_times) == 2 and gen.request_seconds >= gen.token_times[-1] >= gen.token_times[0]
