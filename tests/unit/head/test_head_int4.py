"""The INT4 coarse tier: its bounds stay conservative and certification stays exact, by property testing against
the same float64 ground truth and six emulated fp32 accumulation orders as the INT8 tier (test_head_property).

Per case: every upper bound `U_j` is ≥ the exact dot product of every finite row (checked directly, not only
through the argmax), and every certified row's token equals the dense argmax under every order — zero
disagreements over CASES cases with small vocabularies.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_head_property import (  # noqa: E402
    argmax_lowest,
    assert_certified_rows_match,
    dense_outputs,
    draft_tokens,
    make_case,
)

from draftscope.head.certify import NO_DRAFT, certify  # noqa: E402
from draftscope.head.quant import QuantizedHead, coarse  # noqa: E402
from draftscope.head.quant4 import QMAX4, build_int4, coarse_bytes, int4_group_size  # noqa: E402

CASES = 2000


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The cases are tiny: one torch thread avoids oversubscribing a loaded CPU (25× faster on two busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # CASES cases
@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 24),
    hidden_groups=st.sampled_from([(8, None), (16, 8), (24, 8), (32, 16), (16, 4), (5, None)]),
    rows=st.integers(1, 4),
    k=st.integers(0, 4),
    ties=st.booleans(),
    nan=st.sampled_from([None, None, None, 0, 3]),
    scale=st.sampled_from([0.01, 1.0, 8.0, 200.0]),
    kinds=st.lists(st.integers(0, 2), min_size=3, max_size=3),
)
def test_int4_bounds_hold_and_certified_tokens_match_every_order(
    seed, vocab, hidden_groups, rows, k, ties, nan, scale, kinds
):
    rng = np.random.default_rng(seed)
    hidden, group = hidden_groups
    h, w = make_case(rng, vocab=vocab, hidden=hidden, rows=rows, ties=ties, nan_row=nan, scale=scale)
    head = build_int4(torch.from_numpy(w).to(torch.bfloat16), group)
    assert int(head.q.abs().max()) <= QMAX4
    hidden_t = torch.from_numpy(h).to(torch.bfloat16)
    finite = np.isfinite(h).all(axis=1)
    bounds = coarse(head, hidden_t)
    exact = h @ w.T
    assert (bounds.upper.numpy()[finite] >= exact[finite]).all()
    assert (bounds.a_bound.numpy()[finite] >= (np.abs(h) @ np.abs(w).T)[finite]).all()

    draft = draft_tokens(rng, exact, k, kinds)
    cert = certify(head, hidden_t, torch.tensor([*draft.tolist(), NO_DRAFT]), k=k, bounds=bounds)
    dense = [argmax_lowest(r) for r in dense_outputs(h, w)]
    assert_certified_rows_match(cert, dense, finite)


def test_int4_is_looser_than_int8_yet_still_certifies_a_peaked_row():
    rng = np.random.default_rng(5)
    h, w = make_case(rng, vocab=256, hidden=128, rows=4, ties=False, nan_row=None, scale=1.0)
    h[:] = (w[:4] * 30).astype(np.float32)
    weight, hidden_t = torch.from_numpy(w).to(torch.bfloat16), torch.from_numpy(h).to(torch.bfloat16)
    int8, int4 = QuantizedHead.build(weight, 128), build_int4(weight)
    assert int4.group_size == 128 and (int4.err_linf >= int8.err_linf).all()
    gap8 = coarse(int8, hidden_t).upper.double() - torch.from_numpy(h @ w.T)
    gap4 = coarse(int4, hidden_t).upper.double() - torch.from_numpy(h @ w.T)
    assert (gap4.mean() > 4 * gap8.mean()) and (gap8 >= 0).all() and (gap4 >= 0).all()
    cert = certify(int4, hidden_t, torch.full((4,), NO_DRAFT), k=8)
    assert cert.certified.all() and cert.tokens.tolist() == [0, 1, 2, 3]


def test_int4_group_size_and_bytes():
    assert int4_group_size(5120) == 128 and int4_group_size(192) == 96 and int4_group_size(5) == 5
    with pytest.raises(ValueError, match="does not divide the hidden size 192"):
        int4_group_size(192, 128)
    head = build_int4(torch.ones(10, 256))
    # 10 × 256 weights at 4 bits = 1280 bytes, plus 5 fp32 tables × 10 rows × 2 groups.
    assert coarse_bytes(head, 4) == 1280 + 4 * 5 * 20 and coarse_bytes(head, 8) == 2560 + 400
    with pytest.raises(ValueError, match="qmax 200"):
        QuantizedHead.build(torch.ones(2, 4), qmax=200)
