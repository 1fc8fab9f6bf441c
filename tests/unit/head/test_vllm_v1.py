"""The prefix plugin in vLLM's V1 model runner on a CPU (the CPU engine 0.32), against fakes carrying exactly the
attributes `vllm_v1.V1_ATTRS` declares: the two runner hooks, activation on the CPU path, the certified and the
dense steps, the per-request eligibility and the rows' layout. The real CPU engine runs it in
tests/integration/test_vllm_cpu_engine.py."""

from __future__ import annotations

import json
import multiprocessing.util
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_vllm_prefix_plugin import Model, aligned, greedy, head_weight, vllm_fakes  # noqa: E402

from draftscope.head import select, serving, vllm_plugin, vllm_switch, vllm_v1  # noqa: E402


def v1fake(kind: str, **values):
    assert set(values) == set(vllm_v1.V1_ATTRS[kind]), sorted(set(values) ^ set(vllm_v1.V1_ATTRS[kind]))
    return SimpleNamespace(**values)


def params(**changes):
    base = dict.fromkeys(vllm_v1.V1_ATTRS["sampling_params"])
    base.update(
        temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, min_tokens=0
    )
    return v1fake("sampling_params", **{**base, **changes})


class Sampler:
    pass


class RejectionSampler:
    pass


class MinPLogitsProcessor:
    pass


class V1Runner(SimpleNamespace):
    """The V1 GPUModelRunner as the hooks see it: `execute_model` builds the spec metadata, then the logits."""

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        hidden, drafts = scheduler_output
        if any(drafts):
            self._calc_spec_decode_metadata(np.array([len(d) for d in drafts]), None)
        return self.model.compute_logits(hidden)

    def _calc_spec_decode_metadata(self, num_draft_tokens, cu_num_scheduled_tokens):
        flat = [t for d in self.drafts for t in d]
        return v1fake(
            "spec_metadata", draft_token_ids=torch.tensor(flat), num_draft_tokens=num_draft_tokens.tolist()
        )


class V1Engine:
    def __init__(self, monkeypatch, tmp_path, env=None):
        self.status_path = tmp_path / "prefix_head.json"
        monkeypatch.setattr(vllm_plugin, "_PLUGIN", None)
        monkeypatch.setattr(serving, "probe_device", lambda hidden: serving.DeviceFacts(cuda=False))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(select, "triton_available", lambda: False)
        self.fakes = vllm_fakes(use_v2=False)
        monkeypatch.setattr(vllm_plugin, "_symbol", lambda name: self.fakes.symbols[name])
        monkeypatch.setattr(vllm_v1, "runner_class", lambda: V1Runner)
        monkeypatch.setattr(vllm_plugin.atexit, "register", lambda fn: None)
        monkeypatch.setattr(multiprocessing.util, "Finalize", lambda *args, **kwargs: None)
        monkeypatch.delattr(V1Runner, "_draftscope_v1_hooked", raising=False)
        for name in ("execute_model", "_calc_spec_decode_metadata"):
            monkeypatch.setattr(V1Runner, name, V1Runner.__dict__[name])
        env = {vllm_switch.ENV_SWITCH: "prefix", vllm_switch.ENV_STATUS: str(self.status_path), **(env or {})}
        monkeypatch.delenv(vllm_switch.ENV_SHADOW, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        vllm_plugin.register()
        self.plugin = vllm_plugin._PLUGIN
        self.weight = head_weight(0)
        processor_cls = self.fakes.symbols["LogitsProcessor"]
        self.model = Model(processor_cls, self.weight)
        self.stock = Model(processor_cls, self.weight)
        self.processors = v1fake("logitsprocs", all=[MinPLogitsProcessor()])
        self.requests = {}
        self.runner = V1Runner(
            **vars(
                v1fake(
                    "runner",
                    model=self.model,
                    input_batch=v1fake("input_batch", req_ids=[], logitsprocs=self.processors),
                    requests=self.requests,
                    sampler=Sampler(),
                    rejection_sampler=RejectionSampler(),
                    speculative_config=None,
                )
            ),
            drafts=[],
        )

    def step(self, requests, sampling=None):
        """requests: (draft tokens, tokens its rows point at) per request → (plugin logits, stock logits)."""
        ids = [f"req-{i}" for i in range(len(requests))]
        self.runner.input_batch.req_ids[:] = ids
        for i, req_id in enumerate(ids):
            self.requests[req_id] = v1fake("request", sampling_params=(sampling or {}).get(i, params()))
        self.runner.drafts = [d for d, _ in requests]
        h = torch.cat([aligned(self.weight, targets) for _, targets in requests])
        return self.runner.execute_model((h, self.runner.drafts)), self.stock.compute_logits(h)

    def status(self):
        return json.loads(self.status_path.read_text())


def test_v1_on_a_cpu_hooks_the_runner_and_runs_the_cpu_path(monkeypatch, tmp_path):
    engine = V1Engine(monkeypatch, tmp_path)
    assert V1Runner._draftscope_v1_hooked and engine.plugin.facts["runner"] == "v1"
    out, stock = engine.step([([10, 11, 99], [10, 11, 12, -1])])  # the first step activates, then certifies
    status = engine.status()
    assert status["state"] == "active" and status["runner"] == "v1", status["reason"]
    assert status["implementation"]["name"] == "cpu" and status["startup_check"]["disagreements"] == 0
    assert greedy(out, [10, 11, 99]) == greedy(stock, [10, 11, 99]) == (2, 12)
    assert not torch.equal(out, stock)  # argmax-equivalent logits
    out, stock = engine.step([([10, 11], [10, -1, 12])])  # row 1 is relevant and uncertifiable: dense
    assert torch.equal(out, stock)
    counters = engine.plugin.counters.read()
    assert counters["calls"] == 2 and counters["dense_calls"] == 1 and counters["uncertified_relevant"] == 1


def test_v1_steps_without_drafts_and_with_several_requests(monkeypatch, tmp_path):
    engine = V1Engine(monkeypatch, tmp_path)
    out, stock = engine.step([([], [10]), ([], [20])])  # plain decode: one (bonus) row per request
    assert out.argmax(dim=-1).tolist() == stock.argmax(dim=-1).tolist() == [10, 20]
    out, stock = engine.step([([10], [10, 11]), ([20, 21], [20, 30, 22])])
    assert greedy(out[:2], [10]) == greedy(stock[:2], [10]) and greedy(out[2:], [20, 21]) == (1, 30)
    assert engine.plugin.counters.read()["dense_calls"] == 0


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"temperature": 0.7}, "non-greedy sampling"),
        ({"min_tokens": 4}, "penalties"),
        ({"logit_bias": {3: 1.0}}, "penalties"),
        ({"repetition_penalty": 1.1}, "penalties"),
        ({"logprobs": 2}, "logprobs"),
        ({"structured_outputs": object()}, "structured output"),
    ],
)
def test_v1_ineligible_requests_take_the_dense_head(monkeypatch, tmp_path, changes, reason):
    engine = V1Engine(monkeypatch, tmp_path)
    out, stock = engine.step([([10], [10, 11]), ([20], [20, 21])], sampling={1: params(**changes)})
    assert torch.equal(out, stock)
    assert any(key.startswith(reason) for key in engine.plugin.routing["ineligible"]), engine.plugin.routing


def test_v1_a_custom_logits_processor_makes_the_step_dense(monkeypatch, tmp_path):
    engine = V1Engine(monkeypatch, tmp_path)
    engine.processors.all.append(type("MyProcessor", (), {})())
    out, stock = engine.step([([10], [10, 11])])
    assert torch.equal(out, stock) and engine.plugin.routing["ineligible"]


def test_v1_layout_mismatch_is_dense():
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a", "b"]))
    spec = SimpleNamespace(draft_token_ids=torch.tensor([5, 6]), num_draft_tokens=[2, 0])
    request, draft, pos, n = vllm_v1.layout(runner, {"spec": spec}, 4, torch.device("cpu"))
    assert (request.tolist(), draft.tolist(), pos.tolist(), n) == (
        [0, 0, 0, 1],
        [5, 6, -1, -1],
        [0, 1, 2, 0],
        2,
    )
    assert vllm_v1.layout(runner, {"spec": spec}, 5, torch.device("cpu")) is None
    assert vllm_v1.layout(runner, {"spec": None}, 2, torch.device("cpu"))[1].tolist() == [-1, -1]


def test_v1_runner_checks():
    ok = SimpleNamespace(speculative_config=None, sampler=Sampler(), rejection_sampler=None)
    assert vllm_v1.runner_missing(ok) == []
    odd = SimpleNamespace(
        speculative_config=SimpleNamespace(rejection_sample_method="synthetic"),
        sampler=object(),
        rejection_sampler=None,
    )
    assert len(vllm_v1.runner_missing(odd)) == 2
