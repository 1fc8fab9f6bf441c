"""The decode-loop head: exact tokens on a small random model with shadow checks, counters read only every N
steps, the capture round trip, and the exactness preconditions refused with the reason."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from draftscope.core.errors import UserError  # noqa: E402
from draftscope.head.capture import read_capture, write_capture  # noqa: E402
from draftscope.head.runtime import Capture, CertifiedHead, HeadCounters, check_dense_head  # noqa: E402

pytestmark = pytest.mark.slow  # long: scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def models():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)

    def make(layers):
        return Qwen3ForCausalLM(
            Qwen3Config(
                vocab_size=256,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                max_position_embeddings=256,
            )
        ).eval()

    return make(2), make(1)


@pytest.mark.parametrize("policy", ["prefix", "rowwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_speculative_tokens_equal_the_dense_run(models, policy, dtype):
    from draftscope.decode import speculative_generate

    target, draft = (m.to(dtype) for m in models)
    prompt = list(range(5, 25))
    kwargs = dict(k=4, max_new_tokens=40, eos_token_ids=[], ignore_eos=True)
    dense = speculative_generate(target, draft, prompt, **kwargs)
    head = CertifiedHead(target.lm_head.weight, policy=policy, k=4, shadow=True, read_every=1000)
    got = speculative_generate(target, draft, prompt, head=head, **kwargs)
    assert got.token_ids == dense.token_ids and got.acceptance_lengths == dense.acceptance_lengths
    assert head.counters.host["calls"] == 0  # nothing read yet: counters stay on the device between reads
    report = head.report()
    assert report["calls"] == len(dense.acceptance_lengths) and report["shadow_disagreements"] == 0
    assert (
        report["certified"] + report["uncertified_relevant"] + report["uncertified_irrelevant"]
        == report["rows"]
    )


def test_counters_are_read_every_n_steps():
    counters = HeadCounters(read_every=3)
    for _ in range(5):
        counters.add(calls=1, rows=torch.tensor(4))
        counters.step()
    assert counters.reads == 1 and counters.host["calls"] == 3
    assert counters.read()["rows"] == 20


def test_capture_round_trip(tmp_path, models):
    capture = Capture(limit=2)
    for _ in range(3):
        hidden = torch.randn(3, 32)
        capture.add(hidden, torch.tensor([1, 2]), torch.tensor([1, 7, 9]))
    assert (
        len(capture.calls) == 2 and capture.calls[0]["accepted"] == 1 and capture.calls[0]["next_token"] == 7
    )
    write_capture(tmp_path, capture, torch.float32)
    index, calls = read_capture(tmp_path)
    assert index["hidden_size"] == 32 and [c["accepted"] for c in calls] == [1, 1]
    assert torch.equal(calls[1]["hidden"], capture.calls[1]["hidden"])
    with pytest.raises(UserError, match="no captured head calls"):
        read_capture(tmp_path / "elsewhere")


def test_heads_the_bounds_do_not_cover_are_refused(models):
    target, _ = models
    check_dense_head(target)
    capped = types.SimpleNamespace(
        lm_head=target.lm_head, config=types.SimpleNamespace(final_logit_softcapping=30.0)
    )
    with pytest.raises(UserError, match=r"final_logit_softcapping=30\.0"):
        check_dense_head(capped)
    biased = types.SimpleNamespace(lm_head=torch.nn.Linear(4, 8, bias=True), config=None)
    with pytest.raises(UserError, match="bias"):
        check_dense_head(biased)
