"""The coarse head: INT8 weights with symmetric scales, and the error tables its upper bounds need.

Built once from the exact weights `W [V, D]`. Each row is split into groups of `group_size` columns (per-row
scales: one group of D); each group gets `scale = max|w| / 127` (an fp32 number) and `q = round(w / scale)` in
[−127, 127], so `ŵ = q · scale` exactly. The tables, per row and group, rounded up to fp32:

- `err_l2`, `err_linf`: ‖w − ŵ‖₂ and ‖w − ŵ‖∞ of the group — for `|h·(w_j − ŵ_j)|` by Cauchy–Schwarz
  (‖h_g‖₂‖e‖₂) or Hölder (‖h_g‖₁‖e‖∞), whichever is smaller, summed over groups;
- `w_linf`: max|w| of the group — for `A_j = Σ|h_i w_ji| ≤ Σ_g ‖h_g‖₁ max_g|w|` (the dense head's error scale);
- `q_linf`: max|ŵ| of the group — the same for the coarse pass's own fp32 rounding.

The coarse pass computes `c_j = Σ_g scale_jg · (h_g · q_jg)` in fp32 and an upper bound on the exact dot product:
`U_j = c_j + E_fp(j) + E_quant(j)` with `E_fp = γ_{D+G+1} · Σ_g ‖h_g‖₁ q_linf` (the fp32 error of the coarse sum,
whatever its order) and `E_quant` as above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftscope.head.exact import PAD, gamma, up_to_f32

QMAX = 127


@dataclass(frozen=True)
class QuantizedHead:
    weight: torch.Tensor  # [V, D], the exact head in its own dtype
    q: torch.Tensor  # int8 [V, D]
    scales: torch.Tensor  # fp32 [V, G]
    group_size: int
    err_l2: torch.Tensor  # fp32 [V, G]
    err_linf: torch.Tensor  # fp32 [V, G]
    w_linf: torch.Tensor  # fp32 [V, G]
    q_linf: torch.Tensor  # fp32 [V, G]

    @property
    def vocab(self) -> int:
        return int(self.weight.shape[0])

    @property
    def hidden(self) -> int:
        return int(self.weight.shape[1])

    @property
    def groups(self) -> int:
        return int(self.scales.shape[1])

    @property
    def bytes_int8(self) -> int:
        return self.q.numel() + 4 * (self.scales.numel() + 4 * self.err_l2.numel())

    def dequantized(self) -> torch.Tensor:
        """ŵ = q · scale, fp32 [V, D] (exact)."""
        g = self.group_size
        return (self.q.float().view(self.vocab, self.groups, g) * self.scales[:, :, None]).view(
            self.vocab, -1
        )

    @classmethod
    def build(
        cls,
        weight: torch.Tensor,
        group_size: int | None = None,
        *,
        chunk_rows: int = 4096,
        progress: Callable[[int, int], None] | None = None,
        qmax: int = QMAX,
    ) -> QuantizedHead:
        """Quantize `weight [V, D]`; `group_size` None (or D) means one scale per row; D must be a multiple of it.
        `qmax`: the symmetric integer range [−qmax, qmax] (127 for INT8; `quant4` builds the INT4 tier with 7).
        Rows are independent, so the work goes `chunk_rows` rows at a time through one reused float64 buffer (the
        whole head in float64 would be ~10 GB at V = 248320, D = 5120); the result does not depend on the chunk."""
        if weight.dim() != 2:
            raise ValueError(f"the head weight must be [vocab, hidden], got shape {tuple(weight.shape)}")
        vocab, hidden = weight.shape
        g = hidden if group_size in (None, 0) else int(group_size)
        if g <= 0 or hidden % g:
            raise ValueError(f"group_size {g} does not divide the hidden size {hidden}")
        if not 1 <= qmax <= QMAX:
            raise ValueError(f"qmax {qmax} is outside [1, {QMAX}]: the integers must fit int8")
        groups = hidden // g
        dev = weight.device
        q = torch.empty(vocab, hidden, dtype=torch.int8, device=dev)
        tables = {
            name: torch.empty(vocab, groups, dtype=torch.float32, device=dev)
            for name in ("scales", "err_l2", "err_linf", "w_linf", "q_linf")
        }
        chunk_rows = max(1, chunk_rows)
        buf = torch.empty(min(chunk_rows, vocab), groups, g, dtype=torch.float64, device=dev)
        pad = 1 + PAD
        for start in range(0, vocab, chunk_rows):
            w = weight[start : start + chunk_rows].detach().view(-1, groups, g)
            rows = w.shape[0]
            if not torch.isfinite(w).all():
                raise ValueError("the head weight has non-finite values; no bound holds")
            t = buf[:rows]
            amax = w.abs().amax(dim=2).to(torch.float64)  # exact in the weight's own dtype
            scales = (amax / qmax).to(torch.float32)
            scales = torch.where(
                scales > 0, scales, torch.ones_like(scales)
            )  # an all-zero group: q = 0, exact
            s64 = scales.to(torch.float64)[:, :, None]
            torch.div(w, s64, out=t)  # w / scale in float64 (the weight converts exactly)
            t.round_().clamp_(-qmax, qmax)
            q8 = t.to(torch.int8)
            q_absmax = q8.abs().amax(dim=2).to(torch.float64)
            t.mul_(s64)  # q · scale is exact in float64 (8 + 24 bits)
            torch.sub(w, t, out=t)  # the error w − q·scale, exact in float64
            err_linf = torch.maximum(t.amax(dim=2), -t.amin(dim=2))
            err_l2 = t.square_().sum(dim=2).sqrt()
            stop = start + rows
            q[start:stop] = q8.view(rows, hidden)
            tables["scales"][start:stop] = scales
            tables["err_l2"][start:stop] = up_to_f32(err_l2 * pad).to(torch.float32)
            tables["err_linf"][start:stop] = up_to_f32(err_linf * pad).to(torch.float32)
            tables["w_linf"][start:stop] = up_to_f32(amax * pad).to(torch.float32)
            tables["q_linf"][start:stop] = up_to_f32((q_absmax * s64[:, :, 0]) * pad).to(torch.float32)
            if progress:
                progress(stop, vocab)
        return cls(weight=weight.detach(), q=q, group_size=g, **tables)

    def rows(self, start: int, stop: int) -> QuantizedHead:
        """The head of vocabulary rows [start, stop) (views): rows are quantized independently, so this equals
        building it from `weight[start:stop]`."""
        return QuantizedHead(
            weight=self.weight[start:stop],
            q=self.q[start:stop],
            scales=self.scales[start:stop],
            group_size=self.group_size,
            err_l2=self.err_l2[start:stop],
            err_linf=self.err_linf[start:stop],
            w_linf=self.w_linf[start:stop],
            q_linf=self.q_linf[start:stop],
        )


@dataclass(frozen=True)
class Coarse:
    """The coarse pass over all rows: fp32 logits, upper bounds on the exact dot products, and A_j bounds."""

    logits: torch.Tensor  # fp32 [N, V]
    upper: torch.Tensor  # float64 [N, V]: U_j ≥ h·w_j
    a_bound: torch.Tensor  # float64 [N, V]: ≥ Σ|h_i w_ji|


def group_norms(hidden: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖h_g‖₁, ‖h_g‖₂) per row and group, float64 [N, G], padded up."""
    n, d = hidden.shape
    h = hidden.to(torch.float64).view(n, d // group_size, group_size)
    pad = 1 + PAD
    return h.abs().sum(dim=2) * pad, h.pow(2).sum(dim=2).sqrt() * pad


def coarse_logits(head: QuantizedHead, hidden: torch.Tensor) -> torch.Tensor:
    """c = Σ_g scale_g · (h_g · q_g), fp32 [N, V] — the reference for the coarse kernels."""
    n = hidden.shape[0]
    h = hidden.to(torch.float32)
    if head.groups == 1:
        return (h @ head.q.to(torch.float32).T) * head.scales[:, 0]
    g = head.group_size
    partial = torch.einsum(
        "ngi,vgi->nvg", h.view(n, head.groups, g), head.q.to(torch.float32).view(-1, head.groups, g)
    )
    return (partial * head.scales[None]).sum(dim=2)


def coarse(head: QuantizedHead, hidden: torch.Tensor) -> Coarse:
    """The coarse pass and its bounds for every row of `hidden [N, D]`."""
    logits = coarse_logits(head, hidden)
    l1, l2 = group_norms(hidden, head.group_size)
    e_quant = torch.minimum(
        l2[:, None, :] * head.err_l2[None].double(), l1[:, None, :] * head.err_linf[None].double()
    )
    e_quant = e_quant.sum(dim=2)
    e_fp = gamma(head.hidden + head.groups + 1) * (l1 @ head.q_linf.double().T)
    a_bound = l1 @ head.w_linf.double().T
    c = logits.to(torch.float64)
    upper = c + (e_quant + e_fp) * (1 + PAD) + c.abs() * 2.0**-50
    return Coarse(logits, upper, a_bound)
