"""Which implementation of the certified head the vLLM plugin selects per device, and that the selected stages are
the ones it runs.

- `select.select` for described devices (no GPU needed): CUDA with Triton and conditional nodes → the captured
  graph on the Triton kernels; without conditional nodes or with too many rows → the eager kernels, with the
  reason; without Triton → the reference; a CPU → the CPU coarse pass, with the reason the graph was not chosen.
- The plugin, in a fake vLLM worker whose device is described as an H200 while its tensors live on the CPU, runs
  the Triton kernels under TRITON_INTERPRET=1 (a subprocess: Triton picks the interpreter once per process):
  on `cuda-graph` through the conditional head's body (capture and replay replaced by running the body eagerly,
  the IF node by the dense head when the flag is set — the capture itself is checked on a GPU by
  test_head_graph), on `cuda-triton` eagerly; the tokens equal the stock head's greedy verification and the
  counters count on the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from draftscope.head import select, serving  # noqa: E402
from draftscope.head.graph import BUCKETS  # noqa: E402

pytestmark = pytest.mark.slow  # long: scheduled first (tests/conftest.py)

H200 = serving.DeviceFacts(cuda=True, name="H200", capability=(9, 0), bf16=True, toolkit="12.8")
HERE = Path(__file__).resolve().parent


def test_cuda_with_triton_and_conditional_nodes_selects_the_graph_on_the_kernels():
    impl = select.select(H200, max_rows=16, triton=True, conditional=True)
    assert (impl.name, impl.coarse, impl.graph, impl.reason) == ("cuda-graph", "triton", True, None)
    print(json.dumps(impl.record()))


@pytest.mark.parametrize(
    ("kwargs", "name", "reason"),
    [
        ({"triton": True, "conditional": False}, "cuda-triton", "conditional graph nodes are unavailable"),
        ({"triton": True, "conditional": True, "max_rows": BUCKETS[-1] + 1}, "cuda-triton", "largest graph"),
        ({"triton": False, "conditional": True}, "cuda-reference", "Triton is not installed"),
    ],
)
def test_cuda_without_a_graph_path_records_why(kwargs, name, reason):
    impl = select.select(H200, **{"max_rows": 16, **kwargs})
    assert impl.name == name and not impl.graph and reason in impl.reason
    assert impl.coarse == ("serving.coarse_in_chunks" if name == "cuda-reference" else "triton")
    print(json.dumps(impl.record()))


def test_a_cpu_selects_the_cpu_coarse_pass_whatever_the_process_offers(monkeypatch):
    monkeypatch.setattr(select, "triton_available", lambda: True)
    monkeypatch.setattr(select, "conditional_nodes_available", lambda: True)
    impl = select.select(serving.DeviceFacts(cuda=False), max_rows=16)
    assert impl.name == "cpu" and not impl.graph and impl.reason == select.NO_GPU
    assert impl.coarse == "select.cpu_int8_coarse"
    stages = select.stages(impl, torch.device("cpu"))
    assert stages.coarse is select.coarse_impl(torch.device("cpu")) and stages.topk is stages.refine is None
    # With this process's real availability (monkeypatched): a described GPU gets the graph.
    assert select.select(H200, max_rows=16).name == "cuda-graph"
    print(json.dumps(impl.record()))


def test_the_cpu_coarse_pass_is_int8_by_int8_built_once_per_head_and_its_bounds_hold():
    """The plugin's CPU coarse pass is `cpu_coarse.Int8Coarse` (the pass head-bench times as int8x8) where its probe
    finds torch's int8 GEMM exact here, built once per head; its upper bounds hold against float64 dot products."""
    from draftscope.head.cpu_coarse import Int8Coarse
    from draftscope.head.quant import QuantizedHead

    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(300, 64, generator=gen)
    head = QuantizedHead.build(weight, None)
    hidden = torch.randn(5, 64, generator=gen) * 3
    built = []
    real_build = Int8Coarse.build
    select._INT8.clear()
    try:
        Int8Coarse.build = classmethod(lambda cls, h, **kw: built.append(h) or real_build(h, **kw))  # type: ignore[method-assign]
        first = select.cpu_int8_coarse(head, hidden)
        second = select.cpu_int8_coarse(head, hidden[:1])
    finally:
        Int8Coarse.build = real_build  # type: ignore[method-assign]
        select._INT8.clear()
    exact = hidden.double() @ weight.double().T
    assert bool((first.upper >= exact).all()) and bool((second.upper >= exact[:1]).all())
    if Int8Coarse.available(head):
        assert built == [head], "the INT8 × INT8 pass is built once for the head"
    else:  # a CPU whose int8 GEMM failed the probe: the reference, never an unchecked kernel
        assert built == []


def test_the_triton_stages_are_the_kernels_head_bench_times():
    pytest.importorskip("triton")
    from draftscope.head import triton_kernels as tk

    impl = select.select(H200, max_rows=16, triton=True, conditional=True)
    eager = select.stages(impl, torch.device("cuda"))
    assert (eager.coarse, eager.topk, eager.refine) == (tk.coarse_triton, tk.topk_triton, tk.refine_triton)
    captured = select.stages(impl, torch.device("cuda"), capturable=True)
    assert captured.topk.func is tk.topk_triton and captured.topk.keywords == {"repair": False}


PLUGIN_UNDER_THE_INTERPRETER = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path
    from types import SimpleNamespace
    import pytest, torch
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    import test_vllm_prefix_plugin as t
    from draftscope.head import graph, select, vllm_switch

    class EagerGraph(graph.ConditionalHead):
        # The captured body run eagerly; the IF node's dense head when the flag is set.
        def __init__(self, weight, **kwargs):
            graph._CapturedHead.__init__(self, weight, **kwargs)
            self.replays = 0

        def capture(self, size):
            g = self._buffers(size)
            def replay():
                self.replays += 1
                self._body(g)
                if bool(g.need_dense):
                    self._dense_eager(g)
            g.graph = SimpleNamespace(replay=replay)
            self.graphs[size] = g
            return g

    out = {}
    for conditional in (True, False):
        with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
            mp.setattr(select, "conditional_nodes_available", lambda: conditional)
            mp.setattr(graph, "ConditionalHead", EagerGraph)
            env = {vllm_switch.ENV_MAX_ROWS: "8", vllm_switch.ENV_K: "8", vllm_switch.ENV_READ_EVERY: "1"}
            engine = t.Engine(mp, Path(tmp), triton=True, env=env)
            engine.profile()
            status = engine.status()
            steps = []
            for requests in ([(5, [10, 11, 99], [10, 11, 12, -1])], [(5, [10, 11], [10, -1, 12])]):
                logits, stock = engine.step(requests)
                drafts = requests[0][1]
                steps.append([list(t.greedy(logits, drafts)), list(t.greedy(stock, drafts))])
            plugin = engine.plugin
            out[str(conditional)] = {
                "state": status["state"], "reason": status["reason"],
                "implementation": status["implementation"],
                "startup_disagreements": status["startup_check"]["disagreements"],
                "steps": steps, "counters": plugin.counters.read(),
                "replays": getattr(plugin.graph_head, "replays", None),
                "graph": status.get("graph"),
            }
    print(json.dumps(out))
    """
)


def test_the_plugin_runs_the_selected_triton_stages_under_the_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN_UNDER_THE_INTERPRETER, str(HERE), str(HERE.parents[1])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(runs))
    for conditional, name in (("True", "cuda-graph"), ("False", "cuda-triton")):
        run = runs[conditional]
        assert run["state"] == "active", run["reason"]
        assert run["implementation"]["name"] == name and run["implementation"]["coarse"] == "triton"
        assert run["startup_disagreements"] == 0
        # Step 1: two accepted, 12 corrects 99 (no fallback); step 2: row 1 is uncertifiable and relevant.
        assert run["steps"] == [[[2, 12], [2, 12]], [[1, 0], [1, 0]]], run["steps"]  # a zero row: argmax 0
        counters = run["counters"]
        assert counters["calls"] == 2 and counters["rows"] == 7 and counters["dense_calls"] == 1
        assert counters["uncertified_relevant"] == 1 and counters["uncertified_irrelevant"] == 1
    assert runs["True"]["replays"] == 2 and runs["False"]["replays"] is None
    assert runs["True"]["graph"]["buckets"] == [1, 2, 4, 8] and runs["False"]["graph"] is None
