"""What "exact" means for a dense head, as numbers: the floating-point error constant and monotone roundings.

The dense head computes `f_j` = an fp32 accumulation of `h·w_j` in an order nobody promises, then rounds it to the
output dtype: `r_j = round(f_j)`. For every summation order, `|f_j − s_j| ≤ γ_D · A_j`, where `s_j` is the exact
dot product, `A_j = Σ_i |h_i w_ji|` and `γ_n = n·u / (1 − n·u)` (Higham, the standard dot-product bound; it also
covers the rounding of each product). `u` is fp32's unit roundoff 2^-24 for round-to-nearest; truncating
accumulators (tensor cores) can lose up to 2^-23 per operation, so the kit uses `u = 2^-23 × SAFETY`.

Bounds are carried in float64 and moved to the output dtype by *monotone* roundings: the largest fp32 at or below a
lower bound (resp. the smallest at or above an upper bound), then the output dtype's round-to-nearest-even, which is
monotone. So `lo ≤ f ⇒ round(down32(lo)) ≤ round(f) = r` whatever `f` is, and likewise for upper bounds.
"""

from __future__ import annotations

import torch

U_FP32 = 2.0**-23  # fp32 machine epsilon: a truncating accumulator's worst step, twice round-to-nearest's
# docs/review/head.md: validate on real hardware; the property tests emulate several orders and truncation
SAFETY = 2.0
PAD = 1e-9  # relative pad on every error term computed in float64, for the float64 arithmetic's own rounding

OUTPUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def gamma(n: int, u: float = U_FP32 * SAFETY) -> float:
    """γ_n = n·u / (1 − n·u): the relative error constant of an n-term dot product in any order."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"no error bound for {n} terms at u={u}: n·u ≥ 1")
    return nu / (1 - nu)


def down_to_f32(x: torch.Tensor) -> torch.Tensor:
    """The largest fp32 value ≤ x (x in float64), as float64."""
    f = x.to(torch.float32)
    below = torch.nextafter(f, torch.full_like(f, -float("inf")))
    return torch.where(f.to(torch.float64) > x, below, f).to(torch.float64)


def up_to_f32(x: torch.Tensor) -> torch.Tensor:
    """The smallest fp32 value ≥ x (x in float64), as float64."""
    f = x.to(torch.float32)
    above = torch.nextafter(f, torch.full_like(f, float("inf")))
    return torch.where(f.to(torch.float64) < x, above, f).to(torch.float64)


def to_output(f32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round fp32 values (held in float64) to the output dtype (round-to-nearest-even, monotone); float64 back."""
    return f32.to(torch.float32).to(dtype).to(torch.float64)


def output_lower(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A lower bound on the output value of any fp32 number ≥ x."""
    return to_output(down_to_f32(x), dtype)


def output_upper(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An upper bound on the output value of any fp32 number ≤ x."""
    return to_output(up_to_f32(x), dtype)


def output_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in OUTPUT_DTYPES.values():
            raise ValueError(f"unsupported logits dtype {name}; use one of {', '.join(OUTPUT_DTYPES)}")
        return name
    try:
        return OUTPUT_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"unsupported logits dtype {name!r}; use one of {', '.join(OUTPUT_DTYPES)}"
        ) from None
