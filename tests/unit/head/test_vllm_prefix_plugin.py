"""The vLLM prefix-head plugin on a CPU, against fakes of the vLLM pieces it touches.

vLLM cannot be imported here (it needs CUDA), so the plugin's `_symbol` is pointed at fakes shaped exactly like
the pinned 0.33.0 classes (read from the release wheel by `tests/contract/test_vllm_prefix_plugin_names.py`):

- `FakePluggableLayer` / `FakeLogitsProcessor`: `vllm.model_executor.custom_op.PluggableLayer` (its `__new__`
  redirect through `op_registry_oot`, `register_oot(cls, _decorated_layer_cls=None, name=None)`) and
  `vllm.model_executor.layers.logits_processor.LogitsProcessor` (`__init__(vocab_size, org_vocab_size, scale,
  logits_as_input, soft_cap)`, `forward(lm_head, hidden_states, embedding_bias=None, skip_gather=False)` →
  `_get_logits` → `lm_head.quant_method.apply` (a bf16 `F.linear`) → trim to `org_vocab_size` → soft cap → scale);
- a runner class with the V2 runner's `sample(hidden_states, input_batch, grammar_output)`,
  `_dummy_sampler_run(hidden_states)` and `shutdown()`;
- every other object (runner, input batch, sampler, sampling states, grammar output, configs) is a namespace
  carrying exactly the attributes the plugin declares in `vllm_plugin.ATTRS`, so reading anything undeclared fails.

The device probe is replaced by an H200-like answer (the tensors stay on the CPU). vLLM's greedy sampling is
emulated as vLLM does it for temperature 0: a plain argmax per row (lowest index on ties), the draft checked
against row i being the input token of row i+1, the walk stopping at the first mismatch.
"""

from __future__ import annotations

import json
import multiprocessing.util
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from draftscope.core.errors import UserError  # noqa: E402
from draftscope.head import select, serving, vllm_plugin, vllm_switch  # noqa: E402
from draftscope.head.certify import certify as real_certify  # noqa: E402
from draftscope.head.policy import verify_tokens  # noqa: E402
from draftscope.head.quant import QuantizedHead, coarse  # noqa: E402

VOCAB, PADDED, HIDDEN = 600, 640, 64
H200 = serving.DeviceFacts(
    cuda=True,
    name="fake H200",
    capability=(9, 0),
    bf16=True,
    toolkit="13.0",
    arch_list=("sm_80", "sm_90", "compute_90"),
    free_bytes=100 << 30,
    total_bytes=141 << 30,
)


def fake(kind: str, **values):
    """A namespace with exactly the attributes the plugin declares for `kind`."""
    assert set(values) == set(vllm_plugin.ATTRS[kind]), (
        kind,
        sorted(set(values) ^ set(vllm_plugin.ATTRS[kind])),
    )
    return SimpleNamespace(**values)


class Sampler(SimpleNamespace):
    """vllm.v1.worker.gpu.sample.sampler.Sampler (the plugin checks the class name: no custom sampler)."""


class RejectionSampler(SimpleNamespace):
    """vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler."""


class Uva:
    """UvaBackedTensor: the plugin reads only its host copy `.np`."""

    def __init__(self, values) -> None:
        self.np = np.asarray(values)


# --- fakes of the pinned vLLM classes ----------------------------------------------------------------------------


def vllm_fakes(*, use_v2: bool = True):
    """A fresh set of fake vLLM modules' objects (fresh registries and runner class per test)."""
    registry: dict[str, type] = {}

    class FakePluggableLayer(nn.Module):
        def __new__(cls, *args, **kwargs):
            return super().__new__(registry.get(cls.__name__, cls))

        @classmethod
        def register_oot(cls, _decorated_layer_cls=None, name=None):
            def decorator(layer_cls):
                reg_name = name if name is not None else cls.__name__
                assert reg_name not in registry, f"Duplicate layer name: {reg_name}"
                layer_cls.name = reg_name
                registry[reg_name] = layer_cls
                return layer_cls

            return decorator if _decorated_layer_cls is None else decorator(_decorated_layer_cls)

    class LogitsProcessor(FakePluggableLayer):
        def __init__(self, vocab_size, org_vocab_size=None, scale=1.0, logits_as_input=False, soft_cap=None):
            super().__init__()
            self.scale = scale
            self.vocab_size = vocab_size
            self.logits_as_input = logits_as_input
            self.org_vocab_size = org_vocab_size or vocab_size
            self.soft_cap = soft_cap
            self.use_all_gather = False
            self.head_dtype = None

        def forward(self, lm_head, hidden_states, embedding_bias=None, skip_gather=False):
            logits = (
                hidden_states
                if self.logits_as_input
                else self._get_logits(hidden_states, lm_head, embedding_bias, skip_gather)
            )
            if self.soft_cap is not None:
                logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
            if self.scale != 1.0:
                logits = logits * self.scale
            return logits

        def _get_logits(self, hidden_states, lm_head, embedding_bias, skip_gather=False):
            logits = lm_head.quant_method.apply(lm_head, hidden_states, bias=embedding_bias)
            return logits if skip_gather else logits[..., : self.org_vocab_size]

    class Runner(SimpleNamespace):
        def sample(self, hidden_states, input_batch, grammar_output):
            return self.model.compute_logits(hidden_states[input_batch.logits_indices])

        def _dummy_sampler_run(self, hidden_states):
            return self.model.compute_logits(hidden_states)

        def shutdown(self):
            self.was_shut_down = True

    config = fake("vllm_config", use_v2_model_runner=use_v2, watermark_config=None)
    symbols = {
        "LogitsProcessor": LogitsProcessor,
        "op_registry_oot": registry,
        "get_current_vllm_config": lambda: config,
        "GPUModelRunner": Runner,
        "NO_LOGPROBS": -1,
    }
    return SimpleNamespace(symbols=symbols, registry=registry, config=config, Runner=Runner)


class UnquantizedEmbeddingMethod:
    """vllm's: apply() is the plain GEMM (F.linear) on the layer's weight."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


class LMHead(nn.Module):
    """ParallelLMHead as the plugin reads it: a padded [V_padded, D] bf16 weight, tp_size, quant_method."""

    def __init__(self, weight, tp_size=1, quant_method=None):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.tp_size = tp_size
        self.quant_method = quant_method or UnquantizedEmbeddingMethod()


class Model(nn.Module):
    def __init__(self, processor_cls, weight, **head):
        super().__init__()
        self.lm_head = LMHead(weight, **head)
        self.logits_processor = processor_cls(PADDED, VOCAB)

    def compute_logits(self, hidden_states):
        return self.logits_processor(self.lm_head, hidden_states)


def head_weight(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(PADDED, HIDDEN, generator=gen) * 0.05
    w[VOCAB:] = 0  # vocabulary padding
    return w.to(torch.bfloat16)


def aligned(weight: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Hidden rows pointing at the given tokens' weight rows (a clear winner each); token −1 → a zero row
    (all logits tie at 0: never certifiable)."""
    rows = []
    for t in tokens:
        if t < 0:
            rows.append(torch.zeros(HIDDEN))
        else:
            w = weight[t].float()
            rows.append(w / w.norm() * HIDDEN**0.5)
    return torch.stack(rows).to(torch.bfloat16)


# --- the engine -------------------------------------------------------------------------------------------------


class Engine:
    """One vLLM worker process in miniature: plugin loaded, model built, runner wrapped."""

    def __init__(
        self,
        monkeypatch,
        tmp_path,
        *,
        env=None,
        use_v2=True,
        device=H200,
        model_kwargs=None,
        processor_kwargs=None,
        seed=0,
        triton=False,
    ):
        self.status_path = tmp_path / "prefix_head.json"
        monkeypatch.setattr(vllm_plugin, "_PLUGIN", None)
        monkeypatch.setattr(serving, "probe_device", lambda hidden: device)
        # The tensors here are on the CPU whatever `device` says: the Triton paths need the interpreter
        # (test_head_select runs them under it), so by default a described GPU gets the reference stages.
        monkeypatch.setattr(select, "triton_available", lambda: triton)
        self.fakes = vllm_fakes(use_v2=use_v2)
        monkeypatch.setattr(vllm_plugin, "_symbol", lambda name: self.fakes.symbols[name])
        monkeypatch.setattr(vllm_plugin.atexit, "register", lambda fn: None)
        monkeypatch.setattr(multiprocessing.util, "Finalize", lambda *args, **kwargs: None)
        env = {vllm_switch.ENV_SWITCH: "prefix", vllm_switch.ENV_STATUS: str(self.status_path), **(env or {})}
        monkeypatch.delenv(vllm_switch.ENV_SHADOW, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        vllm_plugin.register()
        self.plugin = vllm_plugin._PLUGIN
        self.weight = head_weight(seed)
        processor_cls = self.fakes.symbols["LogitsProcessor"]
        self.model = Model(processor_cls, self.weight, **(model_kwargs or {}))
        for key, value in (processor_kwargs or {}).items():
            setattr(self.model.logits_processor, key, value)
        # The same processor class, called outside `runner.sample`: no step reaches the plugin, so it is stock.
        self.stock = Model(processor_cls, self.weight, **(model_kwargs or {}))
        self.temperature = np.zeros(8, dtype=np.float32)
        self.needs_processing = np.zeros(8, dtype=bool)
        self.num_logprobs = np.full(8, -1, dtype=np.int32)
        self.num_token_ids = np.zeros(8, dtype=np.int32)
        sampler = Sampler(
            **vars(
                fake(
                    "sampler",
                    sampling_states=fake(
                        "states", temperature=Uva(self.temperature), num_logprobs=self.num_logprobs
                    ),
                    needs_logits_processing=self.needs_processing,
                    logprob_token_ids_state=fake("token_ids_state", num_token_ids=Uva(self.num_token_ids)),
                    trace_replay_state=None,
                    return_sampling_mask=False,
                )
            )
        )
        self.runner = self.fakes.Runner(
            **vars(
                fake(
                    "runner",
                    model=self.model,
                    sampler=sampler,
                    rejection_sampler=RejectionSampler(),
                    batch_sharder=None,
                    model_state=fake("model_state", num_new_sampled_tokens_per_step=1),
                    speculative_config=fake("spec", rejection_sample_method="standard"),
                    vllm_config=self.fakes.config,
                )
            )
        )

    def profile(self, rows: int = 4):
        """vLLM's profiling run: the first call of the target's head (activation happens here)."""
        return self.runner._dummy_sampler_run(torch.zeros(rows, HIDDEN, dtype=torch.bfloat16))

    def step(self, requests: list[tuple[int, list[int], list[int]]], grammar_ids=()):
        """One verification step. Each request: (last sampled token, draft tokens, tokens its rows point at).
        Returns (plugin logits, stock logits)."""
        input_ids, local_pos, hidden, req_ids = [], [], [], []
        for i, (last, drafts, targets) in enumerate(requests):
            assert len(targets) == len(drafts) + 1
            input_ids += [last, *drafts]
            local_pos += list(range(len(drafts) + 1))
            hidden.append(aligned(self.weight, targets))
            req_ids.append(f"req-{i}")
        n = len(input_ids)
        batch = fake(
            "batch",
            num_reqs=len(requests),
            req_ids=req_ids,
            idx_mapping_np=np.arange(len(requests)),
            input_ids=torch.tensor(input_ids),
            logits_indices=torch.arange(n),
            expanded_local_pos=torch.tensor(local_pos, dtype=torch.int32),
        )
        grammar = fake("grammar", structured_output_request_ids=list(grammar_ids)) if grammar_ids else None
        h = torch.cat(hidden)
        out = self.runner.sample(h, batch, grammar)
        return out, self.stock.compute_logits(h)

    def status(self) -> dict:
        return json.loads(self.status_path.read_text())


def greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """vLLM's temperature-0 verification of one request: accepted drafts and the correction / bonus token."""
    return verify_tokens(logits.float().argmax(dim=-1).tolist(), drafts)


# --- the switch -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "0"])
def test_switch_off_register_does_nothing(monkeypatch, value):
    monkeypatch.setattr(vllm_plugin, "_PLUGIN", None)
    if value is None:
        monkeypatch.delenv(vllm_switch.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(vllm_switch.ENV_SWITCH, value)

    def no_vllm(name):
        raise AssertionError(f"the plugin touched vLLM ({name}) with the switch off")

    monkeypatch.setattr(vllm_plugin, "_symbol", no_vllm)
    assert vllm_plugin.register() is None
    assert vllm_plugin._PLUGIN is None


def test_an_unknown_switch_value_is_a_user_error(monkeypatch):
    monkeypatch.setattr(vllm_plugin, "_PLUGIN", None)
    monkeypatch.setenv(vllm_switch.ENV_SWITCH, "yes")
    with pytest.raises(UserError, match=vllm_switch.ENV_SWITCH):
        vllm_plugin.register()


def test_switch_on_replaces_the_logits_processor_and_wraps_the_runner(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    assert set(engine.fakes.registry) == {vllm_plugin.OOT_NAME}
    assert type(engine.model.logits_processor).__name__ == "PrefixLogitsProcessor"
    assert isinstance(engine.model.logits_processor, engine.fakes.symbols["LogitsProcessor"])
    assert engine.fakes.Runner._draftscope_hooked
    vllm_plugin.register()  # vLLM may load plugins more than once: no duplicate registration
    assert engine.plugin.state == "pending" and not engine.status_path.exists()


def test_another_plugin_owning_the_processor_leaves_the_stock_one(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_plugin, "_PLUGIN", None)
    fakes = vllm_fakes()
    fakes.registry[vllm_plugin.OOT_NAME] = type("FlashHeadLogitsProcessor", (), {})
    monkeypatch.setattr(vllm_plugin, "_symbol", lambda name: fakes.symbols[name])
    monkeypatch.setenv(vllm_switch.ENV_SWITCH, "1")
    monkeypatch.setenv(vllm_switch.ENV_STATUS, str(tmp_path / "s.json"))
    vllm_plugin.register()
    status = json.loads((tmp_path / "s.json").read_text())
    assert status["state"] == "stock" and "FlashHeadLogitsProcessor" in status["reason"]
    assert fakes.registry[vllm_plugin.OOT_NAME].__name__ == "FlashHeadLogitsProcessor"


def test_the_v1_runner_on_cuda_keeps_the_stock_engine(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine = Engine(monkeypatch, tmp_path, use_v2=False)
    assert engine.status()["state"] == "stock" and "V1 model runner" in engine.status()["reason"]
    assert not getattr(engine.fakes.Runner, "_draftscope_hooked", False)


# --- activation -------------------------------------------------------------------------------------------------


def test_activation_builds_the_head_and_passes_the_startup_check(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    logits = engine.profile()
    assert torch.equal(logits, engine.stock.compute_logits(torch.zeros(4, HIDDEN, dtype=torch.bfloat16)))
    status = engine.status()
    assert status["state"] == "active", status["reason"]
    check = status["startup_check"]
    assert check["disagreements"] == 0 and check["certified"] > 0 and check["rows"] == 64
    assert status["memory"]["added_bytes"] == VOCAB * HIDDEN + 5 * 4 * VOCAB  # int8 copy + five fp32 tables
    assert status["head"] == {
        "vocab": VOCAB,
        "hidden": HIDDEN,
        "groups": 1,
        "group_size": HIDDEN,
        "dtype": "bfloat16",
    }
    assert status["device"]["capability"] == [9, 0]
    assert engine.plugin.head.weight.data_ptr() == engine.model.lm_head.weight.data_ptr()  # no dense copy


def test_off_cuda_the_plugin_runs_the_cpu_path_and_says_why_not_the_graph(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, device=serving.DeviceFacts(cuda=False))
    engine.profile()
    status = engine.status()
    assert status["state"] == "active", status["reason"]
    impl = status["implementation"]
    assert impl["name"] == "cpu" and impl["graph"] is False and impl["reason"] == select.NO_GPU
    assert impl["coarse"] == "select.cpu_int8_coarse" and status["startup_check"]["disagreements"] == 0
    out, stock = engine.step([(5, [10, 11, 99], [10, 11, 12, -1])])
    assert greedy(out, [10, 11, 99]) == greedy(stock, [10, 11, 99]) == (2, 12)


@pytest.mark.parametrize(
    ("device", "processor_kwargs", "model_kwargs", "expected"),
    [
        ({"capability": (7, 5)}, {}, {}, "compute capability 7.5 < 8.0"),
        ({"bf16": False}, {}, {}, "no bfloat16"),
        ({"toolkit": None}, {}, {}, "without the CUDA toolkit"),
        ({"arch_list": ("sm_80",)}, {}, {}, "toolkit mismatch"),
        ({"free_bytes": 1 << 10}, {}, {}, "not enough free GPU memory"),
        ({}, {"soft_cap": 30.0}, {}, "soft-capped"),
        ({}, {"scale": 0.5}, {}, "scaled"),
        ({}, {}, {"tp_size": 2}, "tensor-parallel"),
        ({}, {}, {"quant_method": type("Fp8LinearMethod", (UnquantizedEmbeddingMethod,), {})()}, "quantized"),
    ],
)
def test_a_missing_prerequisite_records_the_reason_and_keeps_the_stock_head(
    monkeypatch, tmp_path, device, processor_kwargs, model_kwargs, expected
):
    facts = serving.DeviceFacts(**{**vars(H200), **device})
    engine = Engine(
        monkeypatch, tmp_path, device=facts, processor_kwargs=processor_kwargs, model_kwargs=model_kwargs
    )
    for key, value in processor_kwargs.items():
        setattr(engine.stock.logits_processor, key, value)
    engine.profile()
    status = engine.status()
    assert status["state"] == "stock" and expected in status["reason"], status["reason"]
    assert engine.plugin.head is None
    out, stock = engine.step([(5, [10, 11], [10, 11, 12])])
    assert torch.equal(out, stock)


@pytest.mark.parametrize(
    ("runner_change", "expected"),
    [
        ({"rejection_sampler": type("DSparkRejectionSampler", (), {})()}, "a custom sampler"),
        ({"batch_sharder": object()}, "batch-sharded sampling"),
        (
            {"speculative_config": fake("spec", rejection_sample_method="synthetic")},
            "rejection_sample_method",
        ),
        (
            {"model_state": fake("model_state", num_new_sampled_tokens_per_step=2)},
            "2 sampled tokens per step",
        ),
    ],
)
def test_engine_features_that_change_sampling_keep_the_stock_head(
    monkeypatch, tmp_path, runner_change, expected
):
    engine = Engine(monkeypatch, tmp_path)
    for key, value in runner_change.items():
        setattr(engine.runner, key, value)
    engine.profile()
    assert engine.status()["state"] == "stock" and expected in engine.status()["reason"]


def test_the_startup_check_refuses_a_broken_certify(monkeypatch, tmp_path):
    def broken(head, hidden, draft, **kwargs):
        cert = real_certify(head, hidden, draft, **kwargs)
        return type(cert)(
            **{
                **vars(cert),
                "tokens": (cert.tokens + 1) % head.vocab,
                "certified": torch.ones_like(cert.certified),
            }
        )

    monkeypatch.setattr(serving, "certify", broken)
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()
    status = engine.status()
    assert status["state"] == "stock" and status["reason"].startswith("startup check: ")
    assert status["startup_check"]["disagreements"] > 0
    out, stock = engine.step([(5, [10, 11], [10, 11, 12])])
    assert torch.equal(out, stock)


def test_cuda_errors_stop_the_run(monkeypatch, tmp_path):
    def fails(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(serving, "build_head", fails)
    engine = Engine(monkeypatch, tmp_path)
    with pytest.raises(RuntimeError, match="CUDA error"):
        engine.profile()
    assert engine.status()["state"] == "error" and "illegal memory access" in engine.status()["reason"]


def test_out_of_memory_while_building_keeps_the_stock_head(monkeypatch, tmp_path):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(serving, "build_head", oom)
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()
    assert engine.status()["state"] == "stock" and "out of GPU memory" in engine.status()["reason"]


# --- steps ------------------------------------------------------------------------------------------------------


def test_certified_rows_yield_the_certified_token_under_greedy_argmax(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()
    # Rows point at 10, 11, 12 and the bonus row at 13; drafts 10, 11, 99: two accepted, 12 corrects 99. The
    # bonus row (a zero row: uncertifiable) lies after the stop, so it does not call for the dense head.
    out, stock = engine.step([(5, [10, 11, 99], [10, 11, 12, -1])])
    assert greedy(out, [10, 11, 99]) == greedy(stock, [10, 11, 99]) == (2, 12)
    assert not torch.equal(out, stock)  # the argmax-equivalent logits, not the dense ones
    assert torch.equal(out[:3].float().argmax(dim=-1), stock[:3].float().argmax(dim=-1))
    finite = torch.isfinite(out[:3])
    assert (
        finite.sum(dim=-1).tolist() == [1, 1, 1] and out.shape == (4, VOCAB) and out.dtype == torch.bfloat16
    )
    counters = engine.plugin.counters.read()
    assert counters["calls"] == 1 and counters["dense_calls"] == 0 and counters["dense_calls_rowwise"] == 1
    assert counters["uncertified_irrelevant"] == 1 and counters["uncertified_relevant"] == 0


def test_an_uncertified_relevant_row_hands_over_the_dense_logits_untouched(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()
    out, stock = engine.step([(5, [10, 11], [10, -1, 12])])  # row 1 is reached and cannot be certified
    assert torch.equal(out, stock)
    counters = engine.plugin.counters.read()
    assert counters["dense_calls"] == 1 and counters["uncertified_relevant"] == 1
    engine.plugin._read_triggers()
    assert engine.plugin.trigger_host[1] == 1  # the fallback was triggered by row 1 of its request


def test_several_requests_one_dense_pass_when_any_needs_it(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()
    requests = [(5, [10, 11], [10, 11, 12]), (6, [20, 21], [30, 21, 22])]
    out, stock = engine.step(requests)
    for (_, drafts, _), a, b in zip(requests, out.split(3), stock.split(3), strict=True):
        assert greedy(a, drafts) == greedy(b, drafts)
    assert engine.plugin.counters.read()["dense_calls"] == 0
    out, stock = engine.step([(5, [10, 11], [10, 11, 12]), (6, [20, 21], [-1, 21, 22])])
    assert torch.equal(out, stock)


@pytest.mark.parametrize("feature", ["temperature", "penalties", "logprobs", "logprob_token_ids", "grammar"])
def test_ineligible_requests_take_the_dense_path(monkeypatch, tmp_path, feature):
    engine = Engine(monkeypatch, tmp_path)
    engine.profile()

    def no_certify(*args, **kwargs):
        raise AssertionError("certified an ineligible step")

    monkeypatch.setattr(vllm_plugin, "certify", no_certify)
    grammar = ()
    if feature == "temperature":
        engine.temperature[1] = 0.7
    elif feature == "penalties":
        engine.needs_processing[1] = True
    elif feature == "logprobs":
        engine.num_logprobs[1] = 5
    elif feature == "logprob_token_ids":
        engine.num_token_ids[1] = 2
    else:
        grammar = ("req-1",)
    out, stock = engine.step([(5, [10, 11], [10, 11, 12]), (6, [20, 21], [20, 21, 22])], grammar_ids=grammar)
    assert torch.equal(out, stock)
    assert sum(engine.plugin.routing["ineligible"].values()) == 1


def test_too_many_rows_take_the_dense_path(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, env={vllm_switch.ENV_MAX_ROWS: "4"})
    engine.profile()
    out, stock = engine.step([(5, [10, 11], [10, 11, 12]), (6, [20, 21], [20, 21, 22])])
    assert torch.equal(out, stock) and engine.plugin.routing["too_many_rows"] == 1


def test_a_draft_models_head_and_calls_outside_sampling_stay_stock(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path)
    draft = Model(engine.fakes.symbols["LogitsProcessor"], head_weight(seed=1))  # not inside runner.model
    h = aligned(engine.weight, [10, 11])
    token = vllm_plugin._STEP.set(vllm_plugin.Step(engine.runner))
    try:
        out = draft.compute_logits(h)
    finally:
        vllm_plugin._STEP.reset(token)
    assert draft.logits_processor._draftscope_target is False and engine.plugin.state == "pending"
    assert torch.equal(out, F.linear(h, draft.lm_head.weight)[:, :VOCAB])
    assert torch.equal(engine.model.compute_logits(h), engine.stock.compute_logits(h))  # no step: stock


def test_shadow_mode_counts_no_disagreement(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, env={vllm_switch.ENV_SHADOW: "1"})
    engine.profile()
    engine.step([(5, [10, 11, 99], [10, 11, 12, 13])])
    counters = engine.plugin.counters.read()
    assert (
        counters["shadow_calls"] == 1 and counters["shadow_disagreements"] == 0 and counters["certified"] >= 3
    )


def test_dense_mode_is_the_stock_head_with_counters(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, env={vllm_switch.ENV_SWITCH: "dense"})
    engine.profile()
    assert engine.status()["state"] == "active" and engine.plugin.head is None
    out, stock = engine.step([(5, [10, 11], [10, 11, 12])])
    assert torch.equal(out, stock) and engine.plugin.counters.read()["dense_calls"] == 1


def test_counters_are_read_every_n_steps_and_at_shutdown(monkeypatch, tmp_path):
    engine = Engine(monkeypatch, tmp_path, env={vllm_switch.ENV_READ_EVERY: "2"})
    engine.profile()
    for _ in range(3):
        engine.step([(5, [10, 11], [10, 11, 12])])
    status = engine.status()
    assert status["counters"]["calls"] == 2 and status["counter_reads"] == 1 and not status["final"]
    engine.runner.shutdown()
    assert engine.runner.was_shut_down
    status = engine.status()
    assert status["counters"]["calls"] == 3 and status["final"] and status["routing"]["steps"] == 3
    assert status["reference_contract"] == serving.REFERENCE_CONTRACT


# --- the pieces -------------------------------------------------------------------------------------------------


def test_layout_maps_rows_to_requests_and_draft_tokens():
    batch = SimpleNamespace(
        num_reqs=3,
        input_ids=torch.tensor([7, 1, 2, 8, 9, 3, 0]),
        logits_indices=torch.tensor([0, 1, 2, 3, 4, 5]),
        expanded_local_pos=torch.tensor([0, 1, 2, 0, 0, 1], dtype=torch.int32),
    )
    plan = vllm_plugin.layout(batch, 6, torch.device("cpu"))
    assert plan.request.tolist() == [0, 0, 0, 1, 2, 2]
    assert plan.draft.tolist() == [1, 2, -1, -1, 3, -1]
    assert plan.requests == 3
    assert vllm_plugin.layout(batch, 5, torch.device("cpu")) is None


@pytest.mark.parametrize("group_size", [None, 16])
def test_the_chunked_build_equals_the_whole_build(group_size):
    weight = head_weight()[:VOCAB]
    whole = QuantizedHead.build(weight, group_size)
    chunked = serving.build_head(weight, group_size, chunk=128)
    for name in ("q", "scales", "err_l2", "err_linf", "w_linf", "q_linf"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    assert chunked.group_size == whole.group_size


def test_the_chunked_coarse_pass_keeps_its_bounds():
    weight = head_weight()[:VOCAB]
    head = serving.build_head(weight, None)
    hidden = torch.randn(5, HIDDEN).to(torch.bfloat16)
    chunked, whole = serving.coarse_in_chunks(head, hidden, chunk=128), coarse(head, hidden)
    exact = hidden.double() @ weight.double().T
    assert (chunked.upper >= exact).all() and (
        chunked.a_bound >= (hidden.double().abs() @ weight.double().abs().T)
    ).all()
    torch.testing.assert_close(chunked.upper, whole.upper, rtol=1e-6, atol=1e-6)


def test_argmax_equivalent_logits_pick_the_token():
    tokens = torch.tensor([0, 599, 42])
    out = serving.argmax_equivalent(tokens, VOCAB, torch.bfloat16)
    assert out.float().argmax(dim=-1).tolist() == [0, 599, 42]
    assert torch.isfinite(out).sum().item() == 3


def test_runs_on_reads_the_arch_list():
    assert serving._runs_on(("sm_80", "sm_90"), (9, 0))
    assert serving._runs_on(("sm_80", "compute_80"), (9, 0))  # PTX JIT
    assert not serving._runs_on(("sm_80", "sm_86"), (9, 0))
    assert serving._runs_on(("sm_90a",), (9, 0))


# --- the kit's side ---------------------------------------------------------------------------------------------


def test_the_switch_defaults_match_the_head():
    from draftscope.head.certify import DEFAULT_K

    assert vllm_switch.DEFAULT_K == DEFAULT_K


def test_env_for_sets_the_switch_only_for_the_experiment():
    assert vllm_switch.env_for(SimpleNamespace(experimental_prefix=False), "/draftscope/run", {}) == {}
    env = vllm_switch.env_for(SimpleNamespace(experimental_prefix=True), "/draftscope/run", {})
    assert env == {
        vllm_switch.ENV_SWITCH: "prefix",
        vllm_switch.ENV_STATUS: "/draftscope/run/prefix_head.json",
    }
    settings = vllm_switch.settings_from_env(env)
    assert settings.mode == "prefix" and str(settings.status_path) == "/draftscope/run/prefix_head.json"


def test_env_for_passes_the_hosts_tuning_variables_on_and_refuses_a_malformed_one():
    on = SimpleNamespace(experimental_prefix=True)
    host = {
        vllm_switch.ENV_SHADOW: "1",
        vllm_switch.ENV_K: "8",
        "UNRELATED": "x",
        vllm_switch.ENV_MAX_ROWS: " ",
    }
    env = vllm_switch.env_for(on, "/draftscope/run", host)
    assert env[vllm_switch.ENV_SHADOW] == "1" and env[vllm_switch.ENV_K] == "8"
    assert "UNRELATED" not in env and vllm_switch.ENV_MAX_ROWS not in env
    assert vllm_switch.settings_from_env(env).shadow
    with pytest.raises(UserError) as err:
        vllm_switch.env_for(on, "/draftscope/run", {vllm_switch.ENV_K: "many"})
    assert err.value.field == vllm_switch.ENV_K
    assert vllm_switch.env_for(SimpleNamespace(experimental_prefix=False), "/r", host) == {}


@pytest.mark.parametrize("name", [vllm_switch.ENV_K, vllm_switch.ENV_READ_EVERY, vllm_switch.ENV_MAX_ROWS])
def test_malformed_settings_name_the_variable(name):
    with pytest.raises(UserError, match=name):
        vllm_switch.settings_from_env({vllm_switch.ENV_SWITCH: "1", name: "-3"})


def test_read_status(tmp_path):
    assert vllm_switch.read_status(tmp_path)["state"] == "missing"
    (tmp_path / vllm_switch.STATUS_FILE).write_text("{not json")
    assert vllm_switch.read_status(tmp_path)["state"] == "unreadable"
    vllm_switch.write_status(tmp_path / vllm_switch.STATUS_FILE, {"state": "active", "reason": None})
    status = vllm_switch.read_status(tmp_path)
    assert status["state"] == "active" and status["schema_version"] == vllm_switch.STATUS_SCHEMA_VERSION
