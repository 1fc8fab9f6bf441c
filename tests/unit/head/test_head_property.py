"""The head's invariant, by property testing against a float64 ground truth under several accumulation orders.

For random heads, hidden rows and draft tokens — with forced bf16 ties, equal logits at different indices, draft
tokens just outside the top K, NaN and infinite rows, tiny K, per-row and per-group scales — the dense head's output
is emulated in numpy for six fp32 accumulation orders (forward, reverse, pairwise, blocked, fused multiply-add,
truncating), each rounded to bf16 and arg-maxed with ties to the lowest index. Then:

- a certified row's token equals the dense argmax under EVERY order (so certification never picks a token that
  some admissible order would not);
- when the prefix rule does not call for the dense head, accepted tokens, correction token and acceptance length
  equal dense verification under every order; likewise for the row-wise rule.

Plus the prefix rule itself, exhaustively over every status pattern of up to 5 rows and 3 requests.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from draftscope.head.certify import NO_DRAFT, certify  # noqa: E402
from draftscope.head.policy import prefix_decision, rowwise_decision, verify_tokens  # noqa: E402
from draftscope.head.quant import QuantizedHead  # noqa: E402

pytestmark = pytest.mark.slow  # long: scheduled first (tests/conftest.py)

CASES = 2000


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (round-to-nearest-even), back as float64."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).double().numpy()


def rz32(x: np.ndarray) -> np.ndarray:
    """Round float64 toward zero to float32."""
    f = x.astype(np.float32)
    too_far = np.abs(f.astype(np.float64)) > np.abs(x)
    return np.where(too_far, np.nextafter(f, np.float32(0)), f)


def products32(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[N, V, D] products rounded to fp32."""
    return (h[:, None, :].astype(np.float32) * w[None, :, :].astype(np.float32)).astype(np.float32)


def sequential(p: np.ndarray) -> np.ndarray:
    acc = np.zeros(p.shape[:2], dtype=np.float32)
    for i in range(p.shape[2]):
        acc = (acc + p[:, :, i]).astype(np.float32)
    return acc


def pairwise(p: np.ndarray) -> np.ndarray:
    while p.shape[2] > 1:
        if p.shape[2] % 2:
            p = np.concatenate([p, np.zeros((*p.shape[:2], 1), dtype=np.float32)], axis=2)
        p = (p[:, :, 0::2] + p[:, :, 1::2]).astype(np.float32)
    return p[:, :, 0]


def blocked(p: np.ndarray, block: int = 8) -> np.ndarray:
    parts = [sequential(p[:, :, i : i + block]) for i in range(0, p.shape[2], block)]
    return sequential(np.stack(parts, axis=2))


def fma(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = np.zeros((h.shape[0], w.shape[0]), dtype=np.float32)
    for i in range(h.shape[1]):
        acc = (acc.astype(np.float64) + h[:, None, i] * w[None, :, i]).astype(np.float32)
    return acc


def truncating(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = np.zeros((h.shape[0], w.shape[0]), dtype=np.float32)
    for i in range(h.shape[1]):
        acc = rz32(acc.astype(np.float64) + rz32(h[:, None, i] * w[None, :, i]).astype(np.float64))
    return acc


def dense_outputs(h: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """The bf16 logits [N, V] of the dense head under six accumulation orders."""
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
    return [bf16(s) for s in sums]


def argmax_lowest(r: np.ndarray) -> np.ndarray:
    """torch.argmax's rule: the first maximum; a NaN counts as the maximum."""
    return torch.from_numpy(r).argmax(dim=1).numpy()


def make_case(
    rng: np.random.Generator,
    *,
    vocab: int,
    hidden: int,
    rows: int,
    ties: bool,
    nan_row: int | None,
    scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    w = bf16((rng.standard_normal((vocab, hidden)) * 0.1).astype(np.float32))
    if ties and vocab >= 3:
        # Equal logits at different indices, and near-equal ones that collide after bf16 rounding.
        a, b, c = rng.choice(vocab, size=3, replace=False)
        w[b] = w[a]
        w[c] = w[a]
        j = rng.integers(hidden)
        w[c, j] = np.nextafter(np.float32(w[c, j]), np.float32(np.inf))
        w[c] = bf16(w[c].astype(np.float32))
    h = bf16((rng.standard_normal((rows, hidden)) * scale).astype(np.float32))
    if ties and vocab >= 3:
        h[rng.integers(rows)] = bf16((w[a] * 4).astype(np.float32))  # a row that points at the tied tokens
    if nan_row is not None:
        h[nan_row % rows, rng.integers(hidden)] = rng.choice([np.nan, np.inf, -np.inf])
    return h, w


def draft_tokens(rng: np.random.Generator, exact: np.ndarray, k: int, kinds: list[int]) -> np.ndarray:
    """One draft token per proposal row: the exact argmax (accepted), just outside the top K+2, or random."""
    out = []
    for row, kind in zip(exact[:-1], kinds, strict=False):
        order = np.argsort(-np.nan_to_num(row, nan=np.inf), kind="stable")
        if kind == 0:
            out.append(int(order[0]))
        elif kind == 1:
            out.append(int(order[min(len(order) - 1, k + 2 + rng.integers(0, 3))]))
        else:
            out.append(int(rng.integers(len(row))))
    return np.array(out, dtype=np.int64)


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 40),
    hidden_groups=st.sampled_from([(8, None), (16, 8), (24, None), (32, 16), (48, 16), (5, None), (1, None)]),
    rows=st.integers(1, 5),
    k=st.integers(0, 4),
    ties=st.booleans(),
    nan=st.sampled_from([None, None, None, 0, 1, 4]),
    scale=st.sampled_from([0.01, 1.0, 8.0, 200.0]),
    kinds=st.lists(st.integers(0, 2), min_size=4, max_size=4),
)
def test_certified_tokens_and_verification_match_every_accumulation_order(
    seed, vocab, hidden_groups, rows, k, ties, nan, scale, kinds
):
    rng = np.random.default_rng(seed)
    hidden, group = hidden_groups
    h, w = make_case(rng, vocab=vocab, hidden=hidden, rows=rows, ties=ties, nan_row=nan, scale=scale)
    exact = h @ w.T  # float64 ground truth
    outputs = dense_outputs(h, w)
    draft = draft_tokens(rng, exact, k, kinds)
    head = QuantizedHead.build(torch.from_numpy(w).to(torch.bfloat16), group)
    hidden_t = torch.from_numpy(h).to(torch.bfloat16)
    rows_draft = torch.tensor([*draft.tolist(), NO_DRAFT])
    cert = certify(head, hidden_t, rows_draft, k=k, out_dtype=torch.bfloat16)
    dense = [argmax_lowest(r) for r in outputs]

    assert_certified_rows_match(cert, dense, np.isfinite(h).all(axis=1))
    assert_verification_matches(cert, dense, draft, rows_draft)


def assert_certified_rows_match(cert, dense: list[np.ndarray], finite: np.ndarray) -> None:
    """Every certified row is finite and its token is the dense argmax under every accumulation order."""
    tokens = cert.tokens.numpy()
    for i in np.flatnonzero(cert.certified.numpy()):
        assert finite[i]
        for o, d in enumerate(dense):
            assert tokens[i] == d[i], f"row {i}: certified {tokens[i]}, order {o} gives {d[i]}"


def assert_verification_matches(cert, dense: list[np.ndarray], draft: np.ndarray, rows_draft) -> None:
    """Where neither decision asks for a dense pass, every order verifies the draft alike, and so do the tokens."""
    tokens = cert.tokens.numpy()
    request = torch.zeros(len(cert.tokens), dtype=torch.long)
    expected = {verify_tokens(d.tolist(), draft.tolist()) for d in dense}
    for decision in (
        prefix_decision(cert.certified, cert.tokens, rows_draft, request),
        rowwise_decision(cert.certified, request),
    ):
        if not bool(decision.need_dense):
            assert len(expected) == 1, "orders disagree on the verification, yet no dense pass was asked for"
            assert verify_tokens(tokens.tolist(), draft.tolist()) in expected


def test_fp32_logits_are_certified_against_fp32_orders():
    rng = np.random.default_rng(7)
    for _ in range(50):
        h, w = make_case(rng, vocab=32, hidden=16, rows=4, ties=True, nan_row=None, scale=1.0)
        p = products32(h, w)
        dense = [argmax_lowest(s.astype(np.float64)) for s in (sequential(p), pairwise(p), truncating(h, w))]
        head = QuantizedHead.build(torch.from_numpy(w).to(torch.float32))
        cert = certify(
            head, torch.from_numpy(h).float(), torch.full((4,), NO_DRAFT), k=2, out_dtype=torch.float32
        )
        for i in np.flatnonzero(cert.certified.numpy()):
            assert all(int(cert.tokens[i]) == d[i] for d in dense)


def test_the_head_certifies_most_rows_of_a_peaked_distribution():
    """Not only safe but useful: with a clear winner the coarse head certifies (the test fails if it never does)."""
    rng = np.random.default_rng(3)
    h, w = make_case(rng, vocab=512, hidden=64, rows=5, ties=False, nan_row=None, scale=1.0)
    h[:] = bf16((w[:5] * 20).astype(np.float32))  # each row points at one token
    head = QuantizedHead.build(torch.from_numpy(w).to(torch.bfloat16), 16)
    cert = certify(head, torch.from_numpy(h).to(torch.bfloat16), torch.full((5,), NO_DRAFT), k=8)
    assert cert.certified.all() and (cert.tail_margin > 0).all()
    assert cert.tokens.tolist() == argmax_lowest(dense_outputs(h, w)[0]).tolist()


# --- the prefix rule, exhaustively -------------------------------------------------------------------------------

UNCERTIFIED, MATCH, MISMATCH = 0, 1, 2


def walk(statuses: list[int]) -> tuple[bool, list[bool]]:
    """The prefix rule, literally: (needs dense, relevant rows) for one request; the last row is the bonus row."""
    relevant = [False] * len(statuses)
    for i, status in enumerate(statuses):
        relevant[i] = True
        bonus = i == len(statuses) - 1
        if status == UNCERTIFIED:
            return True, relevant
        if status == MISMATCH or bonus:
            return False, relevant
    raise AssertionError("unreachable: the bonus row always ends the walk")


def test_prefix_rule_over_every_status_pattern_and_request_mix():
    patterns = [list(p) for n in range(1, 6) for p in itertools.product((0, 1, 2), repeat=n)]
    rng = np.random.default_rng(0)
    batches = [[p] for p in patterns] + [
        [patterns[i] for i in rng.choice(len(patterns), size=rng.integers(2, 4))] for _ in range(500)
    ]
    for batch in batches:
        certified, tokens, draft, request, want_relevant, want_dense = [], [], [], [], [], []
        for r, statuses in enumerate(batch):
            need, relevant = walk(statuses)
            want_dense.append(need)
            want_relevant += relevant
            for i, status in enumerate(statuses):
                bonus = i == len(statuses) - 1
                certified.append(status != UNCERTIFIED)
                draft.append(NO_DRAFT if bonus else 10 + i)
                tokens.append(10 + i if status == MATCH and not bonus else 99)
                request.append(r)
        args = (torch.tensor(certified), torch.tensor(tokens), torch.tensor(draft), torch.tensor(request))
        got = prefix_decision(*args)
        assert got.request_dense.tolist() == want_dense, batch
        assert bool(got.need_dense) == any(want_dense)
        assert got.relevant.tolist() == want_relevant, batch
        rowwise = rowwise_decision(args[0], args[3])
        assert rowwise.request_dense.tolist() == [not all(c != UNCERTIFIED for c in s) for s in batch]
        # The prefix rule never needs the dense head where the row-wise rule does not.
        assert (got.request_dense <= rowwise.request_dense).all()


def test_an_ineligible_request_always_takes_the_dense_head():
    certified = torch.tensor([True, True, True, True])
    tokens, draft = torch.tensor([5, 6, 7, 8]), torch.tensor([5, NO_DRAFT, 7, NO_DRAFT])
    request = torch.tensor([0, 0, 1, 1])
    got = prefix_decision(certified, tokens, draft, request, eligible=torch.tensor([True, False]))
    assert got.request_dense.tolist() == [False, True] and bool(got.need_dense)
