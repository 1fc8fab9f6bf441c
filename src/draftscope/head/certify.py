"""Certify each row's argmax from the coarse pass plus an exact refine of a few candidates (docs/review/head.md, "One row").

For every row of hidden states:

1. the coarse pass gives `U_j ≥ s_j` (the exact dot product) for every token (`quant.coarse`);
2. candidates `C` = the top-(K+2) tokens by `U`, plus the row's draft token; `T` = the largest `U` outside `C`
   and `A_out` = the largest `A_j` bound outside `C`, so every token outside `C` has output value at most
   `R_out = round(up(T + γ_D·A_out))`;
3. each candidate is refined with the exact weights in fp32: `f'_j`, within `γ_D·A_j` of `s_j` (its own `A_j`,
   computed here), and the dense head's `f_j` within `γ_D·A_j` of `s_j` too, so the dense output value lies in
   `[Lo_j, Hi_j] = [round(down(f'_j − 2γ_D A_j)), round(up(f'_j + 2γ_D A_j))]`;
4. the winner `c*` has the largest `Lo` (lowest index on ties); it is certified iff `R_out < Lo_c*` and every
   other candidate has `Hi_j < Lo_c*`, or `Hi_j == Lo_c*` with `c* < j` (the dense argmax takes the lowest index
   on ties). A row with a NaN or an infinity anywhere is never certified.

Certified rows carry `c*`, which equals the dense head's argmax for every admissible accumulation order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftscope.head.exact import PAD, gamma, output_lower, output_upper
from draftscope.head.quant import Coarse, QuantizedHead, coarse

DEFAULT_K = 64
NO_DRAFT = -1  # the bonus row (after the last proposal) has no draft token

# Pluggable stages (the Triton kernels in `triton_kernels` have these shapes): top-K over U, and the exact refine.
TopK = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
Refine = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Certificate:
    """Per row: the winner, whether it is certified, and the measurements docs/review/head.md asks for."""

    tokens: torch.Tensor  # long [N]: c* (also for uncertified rows: the best guess, never used as final)
    certified: torch.Tensor  # bool [N]
    tail_margin: torch.Tensor  # float64 [N]: Lo_c* − R_out (> 0 when the tail is excluded)
    head_margin: torch.Tensor  # float64 [N]: Lo_c* − max other Hi (≥ 0 when the candidates are excluded)
    ties: torch.Tensor  # long [N]: other candidates with Hi == Lo_c* (decided by the lowest-index rule)
    k_needed: torch.Tensor  # long [N]: the smallest K whose tail bound would still exclude every other token
    finite: torch.Tensor  # bool [N]


def _torch_topk(upper: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    found = torch.topk(upper, k, dim=1)
    return found.values, found.indices


def candidates(
    upper: torch.Tensor, draft: torch.Tensor, k: int, topk: TopK = _torch_topk
) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidate ids [N, m], valid mask [N, m]): top-(K+2) by U plus the draft token (unless already in)."""
    vocab = upper.shape[1]
    top = min(k + 2, vocab)
    ids = topk(upper, top)[1]
    has_draft = draft[:, None] >= 0
    # No draft token (the bonus row): repeat the first candidate, so the slot excludes nothing from the tail.
    extra = torch.where(has_draft, draft[:, None], ids[:, :1])
    valid_extra = has_draft & ~(ids == extra).any(dim=1, keepdim=True)
    return torch.cat([ids, extra], dim=1), torch.cat(
        [torch.ones_like(ids, dtype=torch.bool), valid_extra], dim=1
    )


def refine(
    weight: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(f' fp32 as float64 [N, m], A_j float64 [N, m]) for each row's candidates — the reference for the kernel."""
    w = weight[ids]  # [N, m, D]
    h = hidden.to(torch.float32)
    f = torch.einsum("nd,nmd->nm", h, w.to(torch.float32)).to(torch.float64)
    a = torch.einsum("nd,nmd->nm", hidden.to(torch.float64).abs(), w.to(torch.float64).abs()) * (1 + PAD)
    return f, a


def certify(
    head: QuantizedHead,
    hidden: torch.Tensor,
    draft: torch.Tensor,
    *,
    k: int = DEFAULT_K,
    out_dtype: torch.dtype = torch.bfloat16,
    bounds: Coarse | None = None,
    topk: TopK | None = None,
    refine_fn: Refine | None = None,
) -> Certificate:
    """Certify the dense argmax of every row of `hidden [N, D]`; `draft [N]` holds each row's draft token or -1.
    `bounds`, `topk` and `refine_fn` replace the reference stages (e.g. with the Triton kernels)."""
    d = hidden.shape[1]
    if d != head.hidden:
        raise ValueError(f"hidden rows have {d} features; the head has {head.hidden}")
    draft = draft.to(torch.long).to(hidden.device)
    bounds = bounds if bounds is not None else coarse(head, hidden)
    upper = bounds.upper
    finite = torch.isfinite(hidden).all(dim=1) & torch.isfinite(upper).all(dim=1)
    upper = torch.nan_to_num(upper, nan=float("inf"))
    g = gamma(d)

    ids, valid = candidates(upper, draft, k, topk or _torch_topk)
    outside_u = upper.scatter(1, ids, float("-inf"))
    outside_a = bounds.a_bound.scatter(1, ids, 0.0)
    tail = outside_u.max(dim=1).values  # -inf when every token is a candidate
    a_out = outside_a.max(dim=1).values
    r_out = output_upper(tail + g * a_out * (1 + PAD), out_dtype)

    f, a = (refine_fn or refine)(head.weight, hidden, ids)
    err = 2 * g * a * (1 + PAD)
    lo = output_lower(f - err, out_dtype)
    hi = output_upper(f + err, out_dtype)
    neg = torch.full_like(lo, float("-inf"))
    lo = torch.where(valid, lo, neg)
    hi = torch.where(valid, hi, neg)

    best = lo.max(dim=1, keepdim=True).values
    big = torch.full_like(ids, head.vocab)
    winner = torch.where(lo == best, ids, big).min(dim=1).values  # lowest index among the largest Lo
    best = best[:, 0]
    others = valid & (ids != winner[:, None])
    strict = hi < best[:, None]
    tie_ok = (hi == best[:, None]) & (winner[:, None] < ids)
    candidates_ok = (~others | strict | tie_ok).all(dim=1)
    ties = (others & (hi == best[:, None])).sum(dim=1)
    tail_ok = r_out < best
    finite = finite & torch.isfinite(f).all(dim=1)
    certified = finite & tail_ok & candidates_ok

    other_hi = torch.where(others, hi, neg).max(dim=1).values
    # The K that would have sufficed: tokens whose bound could still reach Lo_c* must all be candidates.
    reach = output_upper(upper + g * bounds.a_bound * (1 + PAD), out_dtype) >= best[:, None]
    k_needed = (reach.sum(dim=1) - 2).clamp(min=0)
    return Certificate(
        tokens=winner,
        certified=certified,
        tail_margin=best - r_out,
        head_margin=best - other_hi,
        ties=ties,
        k_needed=k_needed,
        finite=finite,
    )


def dense_tokens(
    weight: torch.Tensor, hidden: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """The dense reference: fp32 accumulation (no reduced-precision reduction, no split-K), rounded to the output
    dtype, argmax with ties to the lowest index."""
    logits = (hidden.to(torch.float32) @ weight.to(torch.float32).T).to(out_dtype)
    return logits.argmax(dim=1)
