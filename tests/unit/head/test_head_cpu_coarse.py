"""The CPU coarse pass (`head.cpu_coarse`: INT8 activations × INT8 weights) keeps the head exact, by property testing.

Per case (2,000 of them, small vocabularies so the suite stays fast): a random head and hidden rows in bf16 or fp32
with hostile values — magnitudes from subnormal to 1e18, outlier activations, all-zero rows, exact ties and
near-ties after rounding, NaN and infinite entries, per-row and per-group scales, hidden sizes from 1 to 64. Then:

- every upper bound U_j of the pass is at or above the exact dot product h·w_j (the new error terms: activation
  quantization δ·ŵ, the int32 sums turned into fp32, the bounds' own addmm, underflow);
- `certify` with these bounds: a certified row's token equals the dense argmax under each of six fp32 accumulation
  orders (forward, reverse, pairwise, blocked, fused multiply-add, truncating), rounded to the output dtype;
- when the prefix or row-wise rule asks for no dense pass, verification equals dense verification.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_head_property import (  # noqa: E402
    argmax_lowest,
    assert_certified_rows_match,
    assert_verification_matches,
    bf16,
    blocked,
    draft_tokens,
    fma,
    pairwise,
    products32,
    sequential,
    truncating,
)

from draftscope.head.certify import NO_DRAFT, certify  # noqa: E402
from draftscope.head.cpu_coarse import MAX_GROUP, Int8Coarse, padded, probe, probe_qlinear  # noqa: E402
from draftscope.head.quant import QuantizedHead  # noqa: E402

CASES = 2000
DTYPES = {"bfloat16": (torch.bfloat16, bf16), "float32": (torch.float32, lambda x: x.astype(np.float64))}

pytestmark = pytest.mark.skipif(not probe(8), reason="torch._int_mm is not exact on this CPU")


def exact_dots(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """h·w_j rounded once to float64 (every product of two bf16 or fp32 numbers is exact in float64)."""
    return np.array([[math.fsum(row * col) for col in w] for row in h]).reshape(len(h), len(w))


def outputs(h: np.ndarray, w: np.ndarray, rnd) -> list[np.ndarray]:
    """The dense head's output values [N, V] under six fp32 accumulation orders, rounded by `rnd`."""
    p = products32(h, w)
    with np.errstate(invalid="ignore", over="ignore"):
        sums = [
            sequential(p),
            sequential(p[:, :, ::-1]),
            pairwise(p),
            blocked(p),
            fma(h, w),
            truncating(h, w),
        ]
    return [rnd(s.astype(np.float32)) for s in sums]


def hostile_case(rng, *, vocab, hidden, rows, rnd, h_scale, w_scale, ties, outliers, special):
    w = rnd((rng.standard_normal((vocab, hidden)) * w_scale).astype(np.float32))
    h = rnd((rng.standard_normal((rows, hidden)) * h_scale).astype(np.float32))
    if ties and vocab >= 3:
        a, b, c = rng.choice(vocab, size=3, replace=False)
        w[b] = w[a]
        w[c] = w[a]
        j = rng.integers(hidden)
        w[c, j] = np.nextafter(np.float32(w[c, j]), np.float32(np.inf))
        w[c] = rnd(w[c].astype(np.float32))
        h[rng.integers(rows)] = rnd((w[a] * 4 * h_scale / w_scale).astype(np.float32))
    if outliers:  # a few activations three orders of magnitude above the rest
        for _ in range(outliers):
            i, j = rng.integers(rows), rng.integers(hidden)
            h[i, j] = rnd(np.array([h[i, j] * 1000 + h_scale * 1000], dtype=np.float32))[0]
    if special == "zero":
        h[rng.integers(rows)] = 0.0
    elif special == "nonfinite":
        h[rng.integers(rows), rng.integers(hidden)] = rng.choice([np.nan, np.inf, -np.inf])
    return h, w


@pytest.mark.slow  # CASES cases
@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(sorted(DTYPES)),
    vocab=st.integers(2, 40),
    hidden_groups=st.sampled_from([(8, None), (16, 8), (24, None), (32, 16), (64, 16), (5, None), (1, None)]),
    rows=st.integers(1, 5),
    k=st.integers(0, 4),
    h_scale=st.sampled_from([1e-38, 1e-6, 1.0, 300.0, 1e18]),
    w_scale=st.sampled_from([1e-30, 0.1, 1e10]),
    ties=st.booleans(),
    outliers=st.sampled_from([0, 0, 1, 3]),
    special=st.sampled_from([None, None, None, "zero", "nonfinite"]),
    kinds=st.lists(st.integers(0, 2), min_size=4, max_size=4),
    qlinear=st.booleans(),
)
def test_int8_bounds_hold_and_certified_tokens_match_every_order(
    seed, dtype, vocab, hidden_groups, rows, k, h_scale, w_scale, ties, outliers, special, kinds, qlinear
):
    rng = np.random.default_rng(seed)
    hidden, group = hidden_groups
    torch_dtype, rnd = DTYPES[dtype]
    h, w = hostile_case(
        rng,
        vocab=vocab,
        hidden=hidden,
        rows=rows,
        rnd=rnd,
        h_scale=h_scale,
        w_scale=w_scale,
        ties=ties,
        outliers=outliers,
        special=special,
    )
    head = QuantizedHead.build(torch.from_numpy(w).to(torch_dtype), group)
    hidden_t = torch.from_numpy(h).to(torch_dtype)
    # Both kernels: torch._int_mm (exact int32) and, for one scale group, oneDNN's qlinear (fp32 out, its own term).
    qlinear = qlinear and group is None and hidden % 8 == 0 and probe_qlinear(hidden)
    bounds = Int8Coarse.build(head, qlinear=qlinear).coarse(hidden_t)

    finite = np.isfinite(h).all(axis=1)
    exact = exact_dots(h[finite], w)
    upper = bounds.upper.numpy()[finite]
    ok = ~np.isfinite(upper) | (upper >= exact)  # a non-finite U never certifies; a finite one must bound
    assert ok.all(), f"U below the exact dot product at {np.argwhere(~ok)[:3].tolist()}"

    dense = [argmax_lowest(r) for r in outputs(h, w, rnd)]
    with np.errstate(all="ignore"):
        draft = draft_tokens(rng, h @ w.T, k, kinds)
    rows_draft = torch.tensor([*draft.tolist(), NO_DRAFT])
    cert = certify(head, hidden_t, rows_draft, k=k, out_dtype=torch_dtype, bounds=bounds)
    assert_certified_rows_match(cert, dense, finite)
    assert_verification_matches(cert, dense, draft, rows_draft)


def test_int8_pass_still_certifies_a_peaked_distribution():
    """Safe and useful: the looser INT8 × INT8 bounds still certify rows with a clear winner."""
    rng = np.random.default_rng(3)
    w = bf16((rng.standard_normal((512, 64)) * 0.1).astype(np.float32))
    h = bf16((w[:5] * 20).astype(np.float32))
    for group in (None, 16):
        head = QuantizedHead.build(torch.from_numpy(w).to(torch.bfloat16), group)
        bounds = Int8Coarse.build(head).coarse(torch.from_numpy(h).to(torch.bfloat16))
        cert = certify(
            head, torch.from_numpy(h).to(torch.bfloat16), torch.full((5,), NO_DRAFT), k=8, bounds=bounds
        )
        assert cert.certified.all() and cert.tokens.tolist() == list(range(5))


def test_the_int32_accumulator_bound_is_enforced():
    assert MAX_GROUP * 127 * 127 < 2**31 <= (MAX_GROUP + 1) * 127 * 127
    assert padded(1) == 8 and padded(16) == 16 and padded(5120) == 5120
    head = QuantizedHead.build(torch.zeros(2, MAX_GROUP + 1), None)
    with pytest.raises(ValueError, match="overflow"):
        Int8Coarse.build(head)


def test_the_cpu_certified_head_runs_this_pass_and_agrees_with_dense():
    """`runtime.CertifiedHead` on a CPU takes the INT8 × INT8 bounds (where the kernel is exact here) and its tokens
    are the dense head's; with groups it takes the `_int_mm` kernel, per row the qlinear one above one row."""
    # lazy: runtime imports the decode loop's pieces, needed by this test only
    from draftscope.head.runtime import CertifiedHead

    rng = np.random.default_rng(5)
    w = torch.from_numpy(bf16((rng.standard_normal((300, 64)) * 0.1).astype(np.float32))).to(torch.bfloat16)
    h = w[:6].float().mul(20).to(torch.bfloat16)
    for group in (None, 16):
        head = CertifiedHead(w, policy="prefix", group_size=group, shadow=True)
        assert head.int8 is not None and (head.int8.packed is not None) == (
            group is None and probe_qlinear(64)
        )
        tokens = head(h, torch.arange(5), lambda: (h.float() @ w.float().T).to(torch.bfloat16))
        assert tokens.tolist() == [0, 1, 2, 3, 4, 5]
        report = head.report()
        assert report["certified"] == 6 and report["dense_calls"] == 0 and report["shadow_disagreements"] == 0
