"""The device-side branch: the predicated dense kernel under TRITON_INTERPRET=1 on a CPU (flag set: the dense
argmax with ties to the lowest index; flag clear: the output untouched), and — on a GPU only — both captured heads
against the eager certified head and the dense head."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

INTERPRETED = textwrap.dedent(
    """
    import torch
    from draftscope.head.graph_kernels import predicated_dense_argmax
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(300, 48) * 0.2).to(dtype)
        w[7] = w[250]  # equal logits at two indices: the lower one wins
        h = torch.randn(5, 48).to(dtype)
        h[2] = w[250] * 3
        out = torch.full((5,), -5, dtype=torch.long)
        predicated_dense_argmax(h, w, torch.tensor(False), out)
        assert out.tolist() == [-5] * 5, out
        predicated_dense_argmax(h, w, torch.tensor(True), out)
        logits = (h.double() @ w.double().T)
        ref = logits.to(dtype).argmax(dim=1)
        margin = (logits.topk(2).values[:, 0] - logits.topk(2).values[:, 1])
        clear = (margin > 1e-3) | (torch.arange(5) == 2)
        assert (out[clear] == ref[clear]).all(), (out, ref)
        assert int(out[2]) == 7, out
    print("ok")
    """
)


def test_predicated_dense_kernel_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("kind", ["conditional", "predicated"])
def test_captured_heads_match_the_eager_head(kind):
    from draftscope.head.certify import NO_DRAFT, certify
    from draftscope.head.graph import ConditionalHead, PredicatedHead, conditional_nodes_available
    from draftscope.head.quant import QuantizedHead

    if kind == "conditional" and not conditional_nodes_available():
        pytest.skip("CUDA conditional nodes need CUDA >= 12.4")
    torch.manual_seed(0)
    w = (torch.randn(4096, 256, device="cuda") * 0.05).to(torch.bfloat16)
    head = (ConditionalHead if kind == "conditional" else PredicatedHead)(w, k=16, max_requests=4)
    eager = QuantizedHead.build(w)
    for rows in (1, 3, 5, 9):
        h = torch.randn(rows, 256, device="cuda").to(torch.bfloat16)
        draft = torch.full((rows,), NO_DRAFT, dtype=torch.long, device="cuda")
        request = torch.zeros(rows, dtype=torch.long, device="cuda")
        tokens, need, _ = head(h, draft, request, 1)
        cert = certify(eager, h, draft, k=16)
        dense = (h @ w.T).argmax(dim=-1)
        if bool(need):
            assert torch.equal(tokens, dense)
        else:
            assert torch.equal(tokens[cert.certified], dense[cert.certified])
    # A forced fallback: a NaN row is never certified, so the dense head must have run inside the graph.
    h = torch.randn(2, 256, device="cuda").to(torch.bfloat16)
    h[0, 0] = float("nan")
    tokens, need, _ = head(
        h, torch.tensor([5, NO_DRAFT], device="cuda"), torch.zeros(2, dtype=torch.long, device="cuda"), 1
    )
    assert bool(need) and torch.equal(tokens[1:], (h[1:] @ w.T).argmax(dim=-1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_plugins_conditional_head_on_the_triton_stages_counts_on_the_device():
    """The engine plugin's cuda-graph implementation: the Triton stages captured (top-K without its repair), the
    counters and trigger rows added by the replay, the tokens those of the eager certified head or the dense head."""
    from draftscope.head import select, serving
    from draftscope.head.certify import NO_DRAFT
    from draftscope.head.graph import ConditionalHead, conditional_nodes_available
    from draftscope.head.quant import QuantizedHead
    from draftscope.head.runtime import HeadCounters

    if not conditional_nodes_available():
        pytest.skip("CUDA conditional nodes need CUDA >= 12.4")
    torch.manual_seed(0)
    w = (torch.randn(8192, 256, device="cuda") * 0.05).to(torch.bfloat16)
    head = QuantizedHead.build(w)
    facts = serving.probe_device(w)
    impl = select.select(facts, max_rows=16)
    assert impl.name == "cuda-graph", impl
    counters = HeadCounters(w.device, read_every=1000)
    triggers = torch.zeros(17, dtype=torch.int64, device="cuda")
    graph_head = ConditionalHead(
        w,
        k=16,
        max_requests=16,
        quantized=head,
        stages=select.stages(impl, w.device, capturable=True),
        counters=counters,
        triggers=triggers,
    )
    rows = 0
    for n in (1, 3, 4, 9):
        picks = torch.randint(0, 8192, (n,), device="cuda")
        h = (w[picks].float() * 40).to(torch.bfloat16)
        draft = torch.cat([picks[:-1], torch.tensor([NO_DRAFT], device="cuda")])
        replay = graph_head(
            h, draft, torch.zeros(n, dtype=torch.long, device="cuda"), 1, torch.arange(n, device="cuda")
        )
        dense = (h @ w.T).argmax(dim=-1)
        assert torch.equal(replay.tokens[replay.certified], dense[replay.certified])
        if bool(replay.need_dense):
            assert torch.equal(replay.tokens, dense)
        rows += n
    got = counters.read()
    assert got["calls"] == 4 and got["rows"] == rows and got["certified"] > 0
