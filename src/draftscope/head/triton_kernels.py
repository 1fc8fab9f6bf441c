"""Triton kernels for the certified head: the coarse INT8 GEMV with its bounds, a block-wise top-K, and refine.

Each kernel has a torch wrapper with the outputs of the PyTorch reference it replaces:

- `coarse_triton(head, hidden)` → `quant.Coarse` (as `quant.coarse`). One pass over the INT8 weights computes, per
  (row, token), the fp32 logit `c = Σ_g scale_g · (h_g · q_g)` and, fused in the same program, the fp32 sums
  `e = Σ_g min(‖h_g‖₂·err_l2, ‖h_g‖₁·err_linf) + γ_{D+G+1}·‖h_g‖₁·q_linf` (E_quant + E_fp) and
  `a = Σ_g ‖h_g‖₁·w_linf` (the A bound); it then finishes in float64 inside the kernel, with the formula of
  `quant.coarse`: `U = c + e·(1+PAD) + |c|·2^-50`. The group norms are computed once per call, not per token:
  in float64 by `quant.group_norms` (N×D work) and rounded *up* to fp32. Because `e` and `a` are sums of
  non-negative terms computed in fp32 (round-to-nearest, at most G+4 roundings on any path, fewer with FMA
  contraction), the kernel divides them by `1 − γ_{G+4}` (resp. `1 − γ_{G+1}`) before use, so they stay upper
  bounds of the float64 quantities of the reference (larger by ~1e-5 relative at G = 40; see the tests).
  The dot itself: bf16 activations × (INT8 → bf16, exact for |q| ≤ 127) on tensor cores with fp32 accumulation;
  fp32 activations use an IEEE fp32 dot. `c` differs from the reference's `c` only by summation order, which
  `E_fp` covers (both lie within E_fp of the exact coarse sum).
- `topk_triton(upper, k)` → `(values, indices)` like `torch.topk(upper, k, dim=1)`, ties to the lowest index.
  Keys are 64-bit integers: the order-preserving bits of `up_to_f32(U)` in the high half, the complemented index
  in the low half, so one `tl.topk` per block of 1024 tokens keeps its top KP (a power of two > k) and a tree of
  merge launches reduces the blocks. Rounding a float64 U up to fp32 can merge distinct values; the wrapper
  re-ranks the KP survivors in float64 and checks that the KP-th survivor's fp32 key is below the k-th one's (then
  no token outside the survivors can belong to the exact top k); a row that fails the check (more than KP−k
  fp32 ties at the boundary) is re-done with a stable torch sort. So the result is exact for float64 input.
- `refine_triton(weight, hidden, ids)` → `(f, A)` like `certify.refine`: gathers each row's candidate rows of the
  exact weights, fp32 dot `f` and fp32 `Σ|h_i w_ji|`, the latter divided by `1 − γ_{D+1}` and padded like the
  reference, so it is ≥ the reference's float64 sum (an upper bound, as `certify` needs).

Triton is imported only when a kernel is used (`MissingDependency` otherwise). On CPU tensors the kernels run in
Triton's interpreter, which must be chosen before the kernels are defined: set `TRITON_INTERPRET=1` in the
environment before the first kernel call of the process. `compile_kernels(arch)` compiles every kernel for a CUDA
architecture without a GPU (80 → sm_80, 90 → sm_90a: Triton adds the `a` itself for arch ≥ 90).

Over ~400 lines on purpose: the kernels and their torch wrappers share the bound constants, and each is checked
against its reference in quant.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from draftscope.core import settings
from draftscope.core.errors import MissingDependency, UserError
from draftscope.head.exact import PAD, gamma, up_to_f32
from draftscope.head.quant import Coarse, QuantizedHead, group_norms

COARSE_BLOCK_V = 64  # tokens per program (the MMA's M dimension)
COARSE_BLOCK_N = 16  # hidden rows per program (tl.dot needs ≥ 16; fewer rows are masked)
COARSE_BLOCK_D = 128  # columns per step (shrunk to the group size when groups are smaller)
TOPK_BLOCK = 1024  # keys per top-K program (2048 compiles 4× slower for no gain at these sizes)
REFINE_BLOCK_M = 16  # candidates per refine program
REFINE_BLOCK_D = 256


def _triton() -> tuple[Any, Any]:
    # lazy: triton, only when a kernel is used (MissingDependency otherwise)
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise MissingDependency(exc.name or "triton", extra="dev", image="vllm") from None
    return triton, tl


def interpreting() -> bool:
    """Whether Triton kernels defined in this process run in the interpreter (TRITON_INTERPRET=1)."""
    return settings.TRITON_INTERPRET.get()


@functools.cache
def kernels() -> dict[str, Any]:
    """The jitted kernels, defined on first use (so importing this module needs no triton)."""
    triton, tl = _triton()

    @triton.jit
    def coarse_kernel(
        h_ptr,
        q_ptr,
        scale_ptr,
        el2_ptr,
        elinf_ptr,
        qlinf_ptr,
        wlinf_ptr,
        l1_ptr,
        l2_ptr,
        c_ptr,
        u_ptr,
        a_ptr,
        N,
        V,
        D,
        G,
        GS,
        gamma_fp,
        e_pad,
        a_pad,
        c_pad,
        BLOCK_V: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        DOT_BF16: tl.constexpr,
    ):
        pid_v = tl.program_id(0)
        pid_n = tl.program_id(1)
        rv = (pid_v * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mv = rv < V
        mn = rn < N
        c = tl.zeros([BLOCK_V, BLOCK_N], dtype=tl.float32)
        e = tl.zeros([BLOCK_V, BLOCK_N], dtype=tl.float32)
        a = tl.zeros([BLOCK_V, BLOCK_N], dtype=tl.float32)
        for g in range(0, G):
            acc = tl.zeros([BLOCK_V, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, GS, BLOCK_D):
                rk = k0 + tl.arange(0, BLOCK_D)
                mk = rk < GS
                col = g * GS + rk
                q = tl.load(q_ptr + rv[:, None] * D + col[None, :], mask=mv[:, None] & mk[None, :], other=0)
                ht = tl.load(
                    h_ptr + rn[None, :] * D + col[:, None], mask=mn[None, :] & mk[:, None], other=0.0
                )
                if DOT_BF16:
                    # INT8 → bf16 is exact (|q| ≤ 127 needs 7 bits); products of two bf16 are exact in fp32.
                    acc = tl.dot(q.to(tl.bfloat16), ht.to(tl.bfloat16), acc)
                else:
                    acc = tl.dot(q.to(tl.float32), ht.to(tl.float32), acc, input_precision="ieee")
            s = tl.load(scale_ptr + rv * G + g, mask=mv, other=0.0)
            c += acc * s[:, None]
            # The bound terms of this group: tables per token, norms per hidden row (computed once per call).
            l1 = tl.load(l1_ptr + rn * G + g, mask=mn, other=0.0)
            l2 = tl.load(l2_ptr + rn * G + g, mask=mn, other=0.0)
            el2 = tl.load(el2_ptr + rv * G + g, mask=mv, other=0.0)
            elinf = tl.load(elinf_ptr + rv * G + g, mask=mv, other=0.0)
            qlinf = tl.load(qlinf_ptr + rv * G + g, mask=mv, other=0.0)
            wlinf = tl.load(wlinf_ptr + rv * G + g, mask=mv, other=0.0)
            e_quant = tl.minimum(el2[:, None] * l2[None, :], elinf[:, None] * l1[None, :])
            e += e_quant + gamma_fp * (qlinf[:, None] * l1[None, :])
            a += wlinf[:, None] * l1[None, :]
        # Finish in float64, as quant.coarse does: U = c + (E_quant + E_fp)·(1+PAD) + |c|·2^-50.
        c64 = c.to(tl.float64)
        u = c64 + (e.to(tl.float64) * e_pad) + tl.abs(c64) * c_pad
        out = rn[None, :].to(tl.int64) * V + rv[:, None]
        m = mv[:, None] & mn[None, :]
        tl.store(c_ptr + out, c, mask=m)
        tl.store(u_ptr + out, u, mask=m)
        tl.store(a_ptr + out, a.to(tl.float64) * a_pad, mask=m)

    @triton.jit
    def topk_keys_kernel(x_ptr, out_ptr, V, BLOCKS, BLOCK: tl.constexpr, KP: tl.constexpr):
        # Key = (order-preserving int of the fp32 value) · 2^32 + (2^32 − 1 − index): larger value first, then
        # lower index. Padding lanes get −inf at an index ≥ V, below every real token (a real −inf included).
        row = tl.program_id(0)
        blk = tl.program_id(1)
        r = blk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row.to(tl.int64) * V + r, mask=r < V, other=float("-inf"))
        bits = x.to(tl.int32, bitcast=True)
        order = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        key = ((order + 1) << 32) - 1 - r.to(tl.int64)
        top = tl.topk(key, KP)
        tl.store(out_ptr + (row.to(tl.int64) * BLOCKS + blk) * KP + tl.arange(0, KP), top)

    @triton.jit
    def topk_merge_kernel(k_ptr, out_ptr, L, BLOCKS, BLOCK: tl.constexpr, KP: tl.constexpr):
        row = tl.program_id(0)
        blk = tl.program_id(1)
        r = blk * BLOCK + tl.arange(0, BLOCK)
        lowest = tl.full([BLOCK], -2147483648, tl.int32).to(tl.int64) << 32  # −2^63: below every key
        key = tl.load(k_ptr + row.to(tl.int64) * L + r, mask=r < L, other=0)
        key = tl.where(r < L, key, lowest)
        top = tl.topk(key, KP)
        tl.store(out_ptr + (row.to(tl.int64) * BLOCKS + blk) * KP + tl.arange(0, KP), top)

    @triton.jit
    def refine_kernel(
        w_ptr, h_ptr, ids_ptr, f_ptr, a_ptr, M, D, a_pad, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr
    ):
        row = tl.program_id(0)
        pm = tl.program_id(1)
        rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        mm = rm < M
        ids = tl.load(ids_ptr + row * M + rm, mask=mm, other=0).to(tl.int64)
        f = tl.zeros([BLOCK_M], dtype=tl.float32)
        a = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_D):
            rk = k0 + tl.arange(0, BLOCK_D)
            mk = rk < D
            h = tl.load(h_ptr + row.to(tl.int64) * D + rk, mask=mk, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + ids[:, None] * D + rk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
            p = w.to(tl.float32) * h[None, :]
            f += tl.sum(p, axis=1)
            a += tl.sum(tl.abs(p), axis=1)
        tl.store(f_ptr + row * M + rm, f, mask=mm)
        tl.store(a_ptr + row * M + rm, a.to(tl.float64) * a_pad, mask=mm)

    return {
        "coarse": coarse_kernel,
        "topk_keys": topk_keys_kernel,
        "topk_merge": topk_merge_kernel,
        "refine": refine_kernel,
    }


def _check_device(*tensors: Any) -> None:
    if any(t.device.type == "cpu" for t in tensors) and not interpreting():
        raise UserError(
            "Triton kernels on CPU tensors run only in Triton's interpreter",
            fix="set TRITON_INTERPRET=1 in the environment before the first kernel call, or use CUDA tensors",
        )


def _up32(x: float) -> float:
    """The smallest fp32 value ≥ x, as a Python float (a kernel receives Python floats as fp32)."""
    return float(up_to_f32(torch.tensor(x, dtype=torch.float64)))


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def coarse_triton(head: QuantizedHead, hidden: Any) -> Coarse:
    """The coarse pass and its bounds (as `quant.coarse`): logits fp32 [N, V], U and A bounds float64 [N, V]."""
    n, d = hidden.shape
    if d != head.hidden:
        raise ValueError(f"hidden rows have {d} features; the head has {head.hidden}")
    _check_device(hidden, head.q)
    k = kernels()
    l1, l2 = group_norms(hidden, head.group_size)
    l1f = up_to_f32(l1).to(torch.float32).contiguous()
    l2f = up_to_f32(l2).to(torch.float32).contiguous()
    v, g, gs = head.vocab, head.groups, head.group_size
    dev = hidden.device
    logits = torch.empty(n, v, dtype=torch.float32, device=dev)
    upper = torch.empty(n, v, dtype=torch.float64, device=dev)
    a_bound = torch.empty(n, v, dtype=torch.float64, device=dev)
    h = hidden.contiguous()
    # Triton 3.9's interpreter multiplies bf16 operands of tl.dot as their raw bits (and casts int8 → bf16 by
    # bits): there, the same values go through the fp32 dot instead (exact conversions, fp32 accumulation).
    dot_bf16 = h.dtype == torch.bfloat16 and not interpreting()
    if not dot_bf16 and h.dtype != torch.float32:
        h = h.to(torch.float32)
    # Python floats reach a kernel as fp32 scalars: every factor is rounded up, so each stays an upper bound.
    # e_pad: 1/(1 − γ_{G+4}) makes the fp32 sum an upper bound, then the reference's (1 + PAD).
    gamma_fp = _up32(gamma(head.hidden + g + 1))
    e_pad = _up32((1 + PAD) / (1 - gamma(g + 4)))
    a_pad = _up32((1 + PAD) / (1 - gamma(g + 1)))
    block_d = max(16, min(COARSE_BLOCK_D, _pow2(gs)))
    grid = (triton_cdiv(v, COARSE_BLOCK_V), triton_cdiv(n, COARSE_BLOCK_N))
    k["coarse"][grid](
        h,
        head.q,
        head.scales,
        head.err_l2,
        head.err_linf,
        head.q_linf,
        head.w_linf,
        l1f,
        l2f,
        logits,
        upper,
        a_bound,
        n,
        v,
        d,
        g,
        gs,
        gamma_fp,
        e_pad,
        a_pad,
        2.0**-50,
        BLOCK_V=COARSE_BLOCK_V,
        BLOCK_N=COARSE_BLOCK_N,
        BLOCK_D=block_d,
        DOT_BF16=dot_bf16,
    )
    return Coarse(logits, upper, a_bound)


def triton_cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def topk_keys(upper: Any, kp: int, block: int = TOPK_BLOCK) -> Any:
    """The top-`kp` 64-bit keys per row of `upper [N, V]` (see the module docstring), int64 [N, kp], descending."""
    n, v = upper.shape
    _check_device(upper)
    k = kernels()
    x = upper
    if x.dtype != torch.float32:
        x = up_to_f32(x.to(torch.float64)).to(torch.float32)  # monotone: never lowers a value
    # torch.topk ranks NaN above everything; the canonical +NaN has the largest key.
    x = torch.where(torch.isnan(x), torch.full_like(x, float("nan")).abs(), x).contiguous()
    block = max(kp, min(_pow2(block), _pow2(v)))  # short rows: one short block (the interpreter sorts slowly)
    blocks = triton_cdiv(v, block)
    keys = torch.empty(n, blocks * kp, dtype=torch.int64, device=upper.device)
    k["topk_keys"][(n, blocks)](x, keys, v, blocks, BLOCK=block, KP=kp)
    while keys.shape[1] > kp:
        length = keys.shape[1]
        blocks = triton_cdiv(length, block)
        out = torch.empty(n, blocks * kp, dtype=torch.int64, device=upper.device)
        k["topk_merge"][(n, blocks)](keys, out, length, blocks, BLOCK=block, KP=kp)
        keys = out
    return keys


def topk_triton(upper: Any, k: int, *, block: int = TOPK_BLOCK, repair: bool = True) -> tuple[Any, Any]:
    """`(values, indices)` of the `k` largest entries per row of `upper [N, V]`, sorted descending with ties to
    the lowest index: the same as `torch.topk(upper, k, dim=1)` up to the order of ties. `block`: keys per
    program (a power of two; each program keeps the top KP = next power of two above k). `repair=False` (inside
    a captured graph: no host sync) skips the re-sort of rows with too many fp32 ties at the boundary; their
    indices are then k distinct large entries, not necessarily the top k — `certify` stays exact with any
    candidate set (its tail bound is the maximum over every non-candidate), it may only certify less."""
    n, v = upper.shape
    if not 0 < k <= v:
        raise ValueError(f"top-k needs 0 < k ≤ {v}, got k={k}")
    kp = max(16, _pow2(k + 1))
    keys = topk_keys(upper, kp, block)
    low = keys & 0xFFFFFFFF
    raw = 0xFFFFFFFF - low  # the token index; ≥ V only for padding lanes (when V < KP), which rank last
    valid = raw < v
    order = keys >> 32
    # Exact iff every token outside the survivors is strictly below the k-th survivor in fp32, hence in float64
    # (rounding up to fp32 is monotone). With V ≤ KP every token survives.
    exact = (
        (order[:, kp - 1] < order[:, k - 1])
        if v > kp
        else torch.ones(n, dtype=torch.bool, device=keys.device)
    )
    vals = upper.gather(1, raw.clamp(max=v - 1))
    vals = torch.where(valid, vals, torch.full_like(vals, float("-inf")))
    # Re-rank the survivors by the original values, ties to the lowest index: sort by index, then stably by value
    # (padding lanes have the largest indices and −inf, so they come after every real token).
    by_idx = torch.sort(raw, dim=1, stable=True)
    by_val = torch.sort(vals.gather(1, by_idx.indices), dim=1, descending=True, stable=True)
    ids = by_idx.values.gather(1, by_val.indices)[:, :k]
    values = by_val.values[:, :k]
    # (On CUDA this reads the `exact` flags on the host: one synchronization per call.)
    for r in (~exact).nonzero().flatten().tolist() if repair else ():
        # More fp32 ties at the boundary than survivors to spare: a stable full sort of the row, lowest index first.
        full = torch.sort(upper[r], descending=True, stable=True)
        ids[r] = full.indices[:k]
        values[r] = full.values[:k]
    return values, ids


def refine_triton(weight: Any, hidden: Any, ids: Any) -> tuple[Any, Any]:
    """`(f, A)` float64 [N, m] like `certify.refine`: the fp32 dot of each row with each candidate's exact weight
    row, and an upper bound on `Σ|h_i w_ji|` (≥ the reference's float64 sum)."""
    n, d = hidden.shape
    m = ids.shape[1]
    _check_device(weight, hidden)
    if not weight.is_contiguous():
        raise ValueError("refine_triton needs a contiguous [vocab, hidden] weight")
    k = kernels()
    f = torch.empty(n, m, dtype=torch.float32, device=hidden.device)
    a = torch.empty(n, m, dtype=torch.float64, device=hidden.device)
    a_pad = _up32((1 + PAD) / (1 - gamma(d + 1)))
    grid = (n, triton_cdiv(m, REFINE_BLOCK_M))
    k["refine"][grid](
        weight,
        hidden.contiguous(),
        ids.to(torch.int64).contiguous(),
        f,
        a,
        m,
        d,
        a_pad,
        BLOCK_M=REFINE_BLOCK_M,
        BLOCK_D=REFINE_BLOCK_D,
    )
    return f.to(torch.float64), a


# --- ahead-of-time compilation (no GPU needed) -------------------------------------------------------------


@dataclass(frozen=True)
class KernelSpec:
    """One kernel instance to compile: its name, the kernel, its argument types and constexpr values."""

    name: str
    kernel: str
    signature: dict[str, str]
    constexprs: dict[str, Any]


def kernel_specs() -> list[KernelSpec]:
    """The kernel instances the wrappers launch: bf16 activations (the decode path), int8 weights, K = 64; plus
    the coarse pass for fp32 activations (`coarse_fp32`)."""
    ptr = "*fp32"
    coarse_sig = {
        "h_ptr": "*bf16",
        "q_ptr": "*i8",
        "scale_ptr": ptr,
        "el2_ptr": ptr,
        "elinf_ptr": ptr,
        "qlinf_ptr": ptr,
        "wlinf_ptr": ptr,
        "l1_ptr": ptr,
        "l2_ptr": ptr,
        "c_ptr": ptr,
        "u_ptr": "*fp64",
        "a_ptr": "*fp64",
        "N": "i32",
        "V": "i32",
        "D": "i32",
        "G": "i32",
        "GS": "i32",
        "gamma_fp": "fp32",
        "e_pad": "fp32",
        "a_pad": "fp32",
        "c_pad": "fp32",
    }
    coarse_const = {"BLOCK_V": COARSE_BLOCK_V, "BLOCK_N": COARSE_BLOCK_N, "BLOCK_D": COARSE_BLOCK_D}
    kp = _pow2(64 + 2 + 1)
    topk_const = {"BLOCK": TOPK_BLOCK, "KP": kp}
    refine_sig = {
        "w_ptr": "*bf16",
        "h_ptr": "*bf16",
        "ids_ptr": "*i64",
        "f_ptr": ptr,
        "a_ptr": "*fp64",
        "M": "i32",
        "D": "i32",
        "a_pad": "fp32",
    }
    return [
        KernelSpec("coarse", "coarse", coarse_sig, {**coarse_const, "DOT_BF16": True}),
        KernelSpec(
            "coarse_fp32", "coarse", {**coarse_sig, "h_ptr": "*fp32"}, {**coarse_const, "DOT_BF16": False}
        ),
        KernelSpec(
            "topk_keys",
            "topk_keys",
            {"x_ptr": "*fp32", "out_ptr": "*i64", "V": "i32", "BLOCKS": "i32"},
            topk_const,
        ),
        KernelSpec(
            "topk_merge",
            "topk_merge",
            {"k_ptr": "*i64", "out_ptr": "*i64", "L": "i32", "BLOCKS": "i32"},
            topk_const,
        ),
        KernelSpec("refine", "refine", refine_sig, {"BLOCK_M": REFINE_BLOCK_M, "BLOCK_D": REFINE_BLOCK_D}),
    ]


def compile_kernels(
    arch: int, names: list[str] | None = None, *, num_warps: int = 4
) -> dict[str, dict[str, Any]]:
    """Compile kernel instances (all, or those named) for CUDA compute capability `arch` (80, 90, …) without a GPU.

    Returns, per instance, the PTX text, the cubin bytes and the PTX's `.target`. Triton itself picks the
    arch-specific `sm_90a` for 90 (it rejects a string arch such as "90a"). FMA contraction stays on (Triton 3.9's
    default, stated here so the 3.10 change of default does not change the kernels): every bound above allows it.
    These instances carry no divisibility attributes, so the JIT never finds them in a cache: the engine's cache is
    built by `triton_aot` (`python -m draftscope head-aot`), through the JIT's own specialization."""
    triton, _ = _triton()
    # lazy: triton, only when the kernels are compiled
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if interpreting():
        raise UserError("compiling needs the real Triton JIT", fix="unset TRITON_INTERPRET for this process")
    specs = {s.name: s for s in kernel_specs()}
    unknown = sorted(set(names or ()) - set(specs))
    if unknown:
        raise UserError(f"unknown kernel instance {unknown}", fix=f"use one of {', '.join(specs)}")
    target = GPUTarget("cuda", int(arch), 32)
    out: dict[str, dict[str, Any]] = {}
    for name in names or list(specs):
        spec = specs[name]
        signature = {**spec.signature, **dict.fromkeys(spec.constexprs, "constexpr")}
        src = ASTSource(fn=kernels()[spec.kernel], signature=signature, constexprs=spec.constexprs)
        compiled = triton.compile(
            src, target=target, options={"num_warps": num_warps, "enable_fp_fusion": True}
        )
        ptx = compiled.asm.get("ptx", "")
        out[name] = {
            "ptx": ptx,
            "cubin": compiled.asm.get("cubin", b""),
            "target": next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), None),
        }
    return out
