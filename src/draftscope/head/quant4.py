"""The INT4 coarse tier (an experiment): group-128 symmetric 4-bit weights with the INT8 tier's bound structure.

Does a quarter of the dense head's bytes pay for the extra fallbacks its looser bounds cause? `head-study` answers
it on a run's captures, tier beside tier.

The quantizer is `QuantizedHead.build` with `qmax = 7`: per row and group of `INT4_GROUP` columns,
`scale = max|w| / 7` (fp32) and `q = round(w / scale)` clamped to [−7, 7], so `ŵ = q · scale` exactly and the
tables (`err_l2`, `err_linf` of `w − ŵ`, `w_linf`, `q_linf`) are computed from the exact weights as for INT8. The
coarse pass, its upper bound `U_j = c_j + E_fp(j) + E_quant(j)`, the candidates and the refine are the INT8 tier's
code unchanged (`quant.coarse`, `certify.certify`, the Triton kernels: the integers are stored one per int8, and
|q| ≤ 7 converts exactly to bf16), so the same proof covers it; only `E_quant` is larger (the step is
`max|w| / 7`, not `/ 127`: about 18× the per-element error), which costs certified rows, never exactness.

Why symmetric [−7, 7] and not [−8, 7]: with the asymmetric range the scale is either `max|w| / 8`, and then a
group's largest positive weight clips to 7·scale (an error up to a whole step instead of half of one, on exactly
the weights that dominate the logits), or `max|w| / 7` with −8 never used. [−7, 7] keeps every element within half
a step, keeps `q_linf` = `w_linf` up to rounding, and wastes one of 16 codes (0.09 bit per weight).

Bytes: two integers per byte (a packed layout; this module keeps one per int8 for the shared kernels and counts
the packed size), plus five fp32 tables per group — at group 128 the tables add 0.16 byte per weight to the 0.5 of
the integers, which is why the INT4 tier needs groups that large.
"""

from __future__ import annotations

import torch

from draftscope.head.quant import QuantizedHead

QMAX4 = 7
INT4_GROUP = 128
TABLES = 5  # fp32 numbers per (row, group): scale, err_l2, err_linf, w_linf, q_linf


def int4_group_size(hidden: int, requested: int | None = None) -> int:
    """The group size of the INT4 tier for hidden size `hidden`: `requested`, else 128 when it divides `hidden`,
    else the largest divisor of `hidden` below 128 (the kit's tiny target has hidden size 192: groups of 96)."""
    if requested is not None:
        if requested <= 0 or hidden % requested:
            raise ValueError(f"INT4 group size {requested} does not divide the hidden size {hidden}")
        return int(requested)
    return max(g for g in range(1, min(INT4_GROUP, hidden) + 1) if hidden % g == 0)


def build_int4(
    weight: torch.Tensor, group_size: int | None = None, *, chunk_rows: int = 4096
) -> QuantizedHead:
    """The INT4 tier of `weight [V, D]` (`group_size`: see `int4_group_size`)."""
    if weight.dim() != 2:
        raise ValueError(f"the head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")
    group = int4_group_size(int(weight.shape[1]), group_size)
    return QuantizedHead.build(weight, group, chunk_rows=chunk_rows, qmax=QMAX4)


def coarse_bytes(head: QuantizedHead, bits: int) -> int:
    """Bytes the coarse pass reads: the integers packed at `bits` per weight, and the fp32 tables."""
    return (head.vocab * head.hidden * bits + 7) // 8 + 4 * TABLES * head.vocab * head.groups
