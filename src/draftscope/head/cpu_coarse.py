"""The CPU coarse pass: INT8 activations × INT8 weights, exact int32 accumulation, and conservative upper bounds.

torch's weight-only INT8 kernel has no fast multi-row path on a CPU, and a bf16 dequantize-and-multiply does the
dense head's own work. Here the hidden rows are quantized too, per row and scale group: `s = max|h_g| / 127` (an
fp32 number), `q_h = round(h / s)` in [−127, 127], `ĥ = s·q_h` and `δ = h − ĥ`, so `|δ_i| ≤ s/2`. Then one
`torch._int_mm` (oneDNN's s8·s8→s32 GEMM, VNNI where the CPU has it) per group gives `a_g = q_h,g · q_w,g`
exactly: every product is at most 127², so a group of g columns sums to at most g·127² < 2^31 when
g ≤ `MAX_GROUP` (refused otherwise), and the kernel is probed once for exactness on hostile inputs (`probe`).

The coarse value `c_j = Σ_g fl(fl(a_g · s_h,g) · s_w,jg)` (fp32, summed over the groups) and the exact dot product
`s_j = h·w_j` differ by

    h·w_j − ĥ·ŵ_j = δ·ŵ_j + h·(w_j − ŵ_j)          (ĥ·ŵ_j = Σ_g s_h,g s_w,jg a_g exactly)

so `s_j ≤ c_j + E_act + E_w + E_fp` with, per group and summed:
- `E_act = Σ_i|δ_i||ŵ_ji| ≤ min(‖δ‖∞‖ŵ‖₁, ‖δ‖₂‖ŵ‖₂, ‖δ‖₁‖ŵ‖∞)` (tables `wq_l1`, `wq_l2` here, `q_linf` in the head);
- `E_w ≤ min(‖h‖₂‖w − ŵ‖₂, ‖h‖₁‖w − ŵ‖∞)` (the head's `err_l2`, `err_linf`);
- `E_fp ≤ γ_{G+3} · Σ_g ‖ĥ_g‖₁ max|ŵ_jg|` (three roundings per group term, G − 1 additions: every term's
  relative error is within γ_{G+2}), plus an absolute `2^-149` per operation (twice over) for fp32 underflow.
Each row and group picks one option of each min (the smallest on the table's mean over the vocabulary; any choice
is a valid bound), so the bounds are one fp32 `addmm`: `U = c + coef [N, T] @ tables [T, V]`. That addmm rounds
too: for any order `fl(c + Σ_t x_t y_t)` is within `γ_{T+1}(|c| + Σ_t x_t y_t)` of the exact value, and
`|c| ≤ 2 Σ_g ‖ĥ_g‖₁ max|ŵ_jg|`, so the coefficients are raised by that much and divided by `1 − γ_{T+1}`. With a
NaN or infinity anywhere the row's U is not finite or the row itself is not, and `certify` never certifies it.

`quant.coarse` stays the exact reference (and the bounds of the tests' ground truth); this is the pass the CPU
certified head and `head-bench --device cpu` run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from draftscope.head.exact import PAD, gamma, up_to_f32
from draftscope.head.quant import QMAX, Coarse, QuantizedHead, group_norms

MAX_GROUP = (2**31 - 1) // (QMAX * QMAX)  # 133,144 columns: the int32 accumulator cannot overflow below this
TINY = 2.0**-149  # fp32's smallest subnormal: the absolute error of one fp32 operation that underflows
# Table rows, per group: activation-error options, weight-error options, then one row of ones (absolute terms).
WQ_L1, WQ_L2, Q_LINF, ERR_L2, ERR_LINF = range(5)
KINDS = 5


def _up32(x: torch.Tensor) -> torch.Tensor:
    """float64 → the smallest fp32 values at or above, padded for the float64 arithmetic that made x."""
    return up_to_f32(x * (1 + PAD)).to(torch.float32)


def _matmul_is_ieee() -> bool:
    """The bounds' addmm must run in IEEE fp32 (no bf16 or TF32 shortcuts torch may be allowed to take)."""
    return torch.get_float32_matmul_precision() == "highest"


@dataclass(frozen=True)
class Int8Coarse:
    """The INT8 head plus what this pass needs: the weight operands per group and the bound tables."""

    head: QuantizedHead
    operands: tuple[
        torch.Tensor, ...
    ]  # per group: int8 [g', V] (q's columns, transposed; g' ≥ 8, zero-padded)
    tables: torch.Tensor  # fp32 [KINDS·G + 1, V]: wq_l1, wq_l2, q_linf, err_l2, err_linf per group, then ones
    means: (
        torch.Tensor
    )  # float64 [KINDS, G]: each table's mean over the vocabulary (to pick an option per row)
    packed: torch.Tensor | None = None  # one scale group only: the weights prepacked for oneDNN's qlinear

    @classmethod
    def available(cls, head: QuantizedHead) -> bool:
        """Whether this pass is exact here for `head` (the int32 bound holds and the kernel passed `probe`)."""
        return head.weight.device.type == "cpu" and probe(padded(head.group_size))

    @classmethod
    def build(cls, head: QuantizedHead, *, qlinear: bool | None = None, chunk_rows: int = 4096) -> Int8Coarse:
        """`qlinear`: multi-row calls through oneDNN's prepacked qlinear (None: where `probe_qlinear` passes)."""
        g = head.group_size
        if g > MAX_GROUP:
            raise ValueError(
                f"group_size {g}: an int32 sum of {g} products of 127·127 can overflow; "
                f"use groups of at most {MAX_GROUP} columns"
            )
        operands = []
        for k in range(head.groups):
            q = head.q[:, k * g : (k + 1) * g]
            if padded(g) != g:
                q = torch.cat([q, q.new_zeros(q.shape[0], padded(g) - g)], dim=1)
            operands.append(q.T)
        wq_l1, wq_l2 = torch.empty_like(head.scales), torch.empty_like(head.scales)
        for start in range(0, head.vocab, chunk_rows):  # int32 temporaries a chunk at a time
            q = head.q[start : start + chunk_rows].view(-1, head.groups, g).to(torch.int32)
            s = head.scales[start : start + chunk_rows].double()
            # Σ|q| and Σq² are exact integers (below 2^31 by MAX_GROUP); one rounding each, then the sqrt.
            wq_l1[start : start + chunk_rows] = _up32(q.abs().sum(dim=2).double() * s)
            wq_l2[start : start + chunk_rows] = _up32(q.square_().sum(dim=2).double().sqrt() * s)
        kinds = [wq_l1, wq_l2, head.q_linf, head.err_l2, head.err_linf]
        tables = torch.stack(kinds, dim=0)  # [KINDS, V, G]
        means = tables.double().mean(dim=1)
        flat = tables.permute(0, 2, 1).reshape(KINDS * head.groups, head.vocab)
        ones = torch.ones(1, head.vocab, dtype=torch.float32, device=flat.device)
        if qlinear is None:
            qlinear = head.groups == 1 and head.hidden % 8 == 0 and probe_qlinear(head.hidden)
        if qlinear and head.groups != 1:
            raise ValueError("the qlinear kernel takes one scale group per row (group_size None)")
        packed = torch.ops.onednn.qlinear_prepack(head.q, None) if qlinear else None
        return cls(head, tuple(operands), torch.cat([flat, ones]).contiguous(), means, packed)

    def qlinear(self, rows: int) -> bool:
        """Whether a call with this many rows runs oneDNN's qlinear (measured faster above one row) or _int_mm."""
        return self.packed is not None and rows > 1

    def quantize(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(q_h int8 [N, G, g], s_h fp32 [N, G], upper bounds on the norms of δ, h and ĥ per row and group)."""
        n = hidden.shape[0]
        g = self.head.group_size
        h = hidden.detach().to(torch.float64).view(n, self.head.groups, g)  # exact (bf16 or fp32 in)
        amax = h.abs().amax(dim=2)
        scale = (amax / QMAX).to(torch.float32)
        scale = torch.where(
            scale > 0, scale, torch.ones_like(scale)
        )  # all zeros (or underflow): q = 0, δ = h
        s64 = scale.double()[:, :, None]
        q = (h / s64).round_().clamp_(-QMAX, QMAX).nan_to_num_(0.0)
        # δ = h − q·s is exact in float64: q·s has at most 31 significant bits and |δ| ≤ s/2 (or δ = h when q = 0).
        delta = (h - q * s64).abs_()
        slack = amax * 2.0**-50  # in case of a subnormal corner, an absolute pad on every δ norm
        norms = {
            "d_linf": delta.amax(dim=2) + slack,
            "d_l2": delta.square().sum(dim=2).sqrt() + slack * g,
            "d_l1": delta.sum(dim=2) + slack * g,
            "hq_l1": q.abs().sum(dim=2) * s64[:, :, 0],
        }
        l1, l2 = group_norms(hidden.detach(), g)
        norms = {k: v * (1 + PAD) for k, v in norms.items()} | {"h_l1": l1, "h_l2": l2, "s_h": s64[:, :, 0]}
        return q.to(torch.int8), scale, norms

    def logits(self, q_h: torch.Tensor, s_h: torch.Tensor) -> torch.Tensor:
        """c fp32 [N, V] = Σ_g fl(fl(a_g · s_h,g) · s_w,g), a_g = q_h,g · q_w,g exact in int32."""
        if self.qlinear(q_h.shape[0]):
            assert self.packed is not None
            c = _qlinear(q_h[:, 0], self.packed, self.head.vocab)  # ≈ a, within `QLINEAR_EPILOGUE` (below)
            return c.mul_(s_h[:, :1]).mul_(self.head.scales[:, 0])
        c = None
        for k, operand in enumerate(self.operands):
            a = q_h[:, k]
            if operand.shape[0] != a.shape[1]:
                a = torch.cat([a, a.new_zeros(a.shape[0], operand.shape[0] - a.shape[1])], dim=1)
            term = torch.mul(torch._int_mm(a.contiguous(), operand), s_h[:, k, None])
            term.mul_(self.head.scales[:, k])
            c = term if c is None else c.add_(term)
        assert c is not None
        return c

    def coefficients(self, norms: dict[str, torch.Tensor]) -> torch.Tensor:
        """coef fp32 [N, KINDS·G + 1] so that U = c + coef @ tables bounds every exact dot product (docstring)."""
        groups = self.head.groups
        n = norms["h_l1"].shape[0]
        coef = torch.zeros(n, KINDS, groups, dtype=torch.float64, device=norms["h_l1"].device)
        act = torch.stack([norms["d_linf"], norms["d_l2"], norms["d_l1"]])  # pairs with WQ_L1, WQ_L2, Q_LINF
        pick = (act * self.means[:3, None, :]).argmin(dim=0)  # [N, G]
        coef[:, :3].scatter_(1, pick[:, None], act.gather(0, pick[None])[0][:, None])
        weight = torch.stack([norms["h_l2"], norms["h_l1"]])  # pairs with ERR_L2, ERR_LINF
        pick = (weight * self.means[3:, None, :]).argmin(dim=0)
        coef[:, 3:].scatter_(1, pick[:, None], weight.gather(0, pick[None])[0][:, None])
        terms = KINDS * groups + 1
        g_mm = gamma(terms + 1)
        coef[:, Q_LINF] += (gamma(groups + 3) + 2 * g_mm) * norms["hq_l1"]  # E_fp and the addmm's |c| share
        if self.qlinear(
            n
        ):  # the qlinear output's own rounding, and its share of E_fp and of |c| (twice over)
            coef[:, WQ_L1, 0] += 2 * QLINEAR_EPILOGUE * norms["s_h"][:, 0]
        ones = torch.full((n, 1), (8 * groups + terms + 2) * TINY, dtype=torch.float64, device=coef.device)
        coef = torch.cat([coef.reshape(n, -1), ones], dim=1) / (1 - g_mm)
        return _up32(coef)

    def bounds(self, c: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        """U fp32 [N, V] = c + coef @ tables, an upper bound on every token's exact dot product."""
        if _matmul_is_ieee():
            return torch.addmm(c, coef, self.tables)
        upper = c.clone()
        for t in range(self.tables.shape[0]):  # elementwise: IEEE whatever the matmul precision setting
            upper.addcmul_(coef[:, t, None], self.tables[t][None])
        return upper

    def upper(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c, U), both fp32 [N, V]."""
        q_h, s_h, norms = self.quantize(hidden)
        c = self.logits(q_h, s_h)
        return c, self.bounds(c, self.coefficients(norms))

    def coarse(self, hidden: torch.Tensor) -> Coarse:
        """The `quant.Coarse` that `certify(bounds=…)` takes: U as float64, per-token A bounds as the reference's."""
        c, upper = self.upper(hidden)
        l1, _ = group_norms(hidden, self.head.group_size)
        return Coarse(c, upper.double(), l1 @ self.head.w_linf.double().T)


def padded(group_size: int) -> int:
    """The width of a group's weight operand: oneDNN's s8 GEMM misreads a one-column operand, so a group whose
    width is not a multiple of 8 gets zero columns (which add nothing to any sum)."""
    return group_size + (-group_size) % 8


@functools.lru_cache(maxsize=16)
def probe(width: int, rows: int = 16, vocab: int = 64) -> bool:
    """Whether `torch._int_mm` is exact here for [n, width] × [width, vocab] operands laid out as this pass lays
    them out, n = 1..`rows`, on the largest magnitudes (where a kernel that saturates 16-bit intermediate sums, as
    non-VNNI code paths may, would go wrong). Checked once per width and process."""
    if not hasattr(torch, "_int_mm") or width > MAX_GROUP:
        return False
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-QMAX, QMAX + 1, (vocab, width), generator=gen, dtype=torch.int8)
    w[: vocab // 2] = torch.where(w[: vocab // 2] >= 0, QMAX, -QMAX).to(torch.int8)
    w[0], w[1] = QMAX, -QMAX
    for n in range(1, rows + 1):
        h = torch.randint(-QMAX, QMAX + 1, (n, width), generator=gen, dtype=torch.int8)
        h[0] = QMAX
        h[-1] = torch.where(w[2] >= 0, QMAX, -QMAX).to(torch.int8)
        try:
            got = torch._int_mm(h, w.T)
        except RuntimeError:  # no CPU kernel in this torch build
            return False
        if not torch.equal(got.long(), h.long() @ w.long().T):
            return False
    return True


# oneDNN's qlinear takes unsigned activations with a zero point: u = q_h + 128 in [1, 255]. It sums u·q_w in int32
# (exact, as `probe_qlinear` checks on the largest magnitudes), takes off 128·Σq_w and returns fp32. Whatever the
# order of its few fp32 steps (at most 8 roundings allowed), the output is within γ_8·(255 + 128)·Σ_i|q_w,i| of
# the exact a = q_h·q_w; in real units that is `QLINEAR_EPILOGUE`·s_h·‖ŵ_j‖₁, a term on the `wq_l1` table.
ZERO_POINT = 128
QLINEAR_EPILOGUE = gamma(8) * (255 + ZERO_POINT)


def _qlinear(q_h: torch.Tensor, packed: torch.Tensor, vocab: int) -> torch.Tensor:
    u = (q_h.to(torch.int16) + ZERO_POINT).to(torch.uint8)
    ones = torch.ones(vocab, dtype=torch.float32)
    zeros = torch.zeros(vocab, dtype=torch.long)
    return torch.ops.onednn.qlinear_pointwise(
        u.contiguous(), 1.0, ZERO_POINT, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


@functools.lru_cache(maxsize=16)
def probe_qlinear(width: int, rows: int = 16, vocab: int = 64) -> bool:
    """Whether oneDNN's qlinear is here and within its stated error for [n, width] rows, n = 2..`rows`, on the
    largest magnitudes (a saturating 16-bit path would miss by far more)."""
    if width > MAX_GROUP or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return False
    gen = torch.Generator().manual_seed(1)
    w = torch.where(torch.rand(vocab, width, generator=gen) < 0.5, QMAX, -QMAX).to(torch.int8)
    w[0], w[1] = QMAX, -QMAX
    try:
        packed = torch.ops.onednn.qlinear_prepack(w, None)
    except RuntimeError:
        return False
    allowed = QLINEAR_EPILOGUE * w.abs().double().sum(dim=1)
    for n in range(2, rows + 1):
        h = torch.randint(-QMAX, QMAX + 1, (n, width), generator=gen, dtype=torch.int8)
        h[0] = QMAX
        h[1] = torch.where(w[2] >= 0, QMAX, -QMAX).to(torch.int8)
        try:
            got = _qlinear(h, packed, vocab).double()
        except RuntimeError:
            return False
        if not ((got - (h.long() @ w.long().T).double()).abs() <= allowed).all():
            return False
    return True
