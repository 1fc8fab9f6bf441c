"""The predicated dense head for the ablation of the device-side branch: a Triton dense GEMV + argmax that reads a
device flag and returns at once when it is clear, so a captured graph launches it on every replay but it only
works when the prefix rule asked for the dense head.

Two kernels: per (row, vocabulary block) the fp32 dot products, rounded to the weight's dtype like a dense head's
output, then the block's maximum and its lowest index; then per row the reduction over blocks (ties to the lowest
index, as torch.argmax). NaN logits are not ordered here (torch.argmax would return a NaN's index). Checked on a
CPU under `TRITON_INTERPRET=1` (tests/unit/head/test_head_graph.py).
"""

from __future__ import annotations

import torch

from draftscope.core.errors import MissingDependency

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the GPU images and the dev extra have triton
    triton = None

BLOCK_V = 64
BLOCK_D = 64
INDEX_SENTINEL = 2**31 - 1

if triton is not None:

    @triton.jit
    def _dense_blocks(
        h_ptr,
        w_ptr,
        flag_ptr,
        max_ptr,
        idx_ptr,
        V,
        D,
        NB,
        BLOCK_V: tl.constexpr,
        BLOCK_D: tl.constexpr,
        ROUND_BF16: tl.constexpr,
    ):
        row = tl.program_id(0)
        block = tl.program_id(1)
        flag = tl.load(flag_ptr)
        if flag != 0:
            offs_v = block * BLOCK_V + tl.arange(0, BLOCK_V)
            acc = tl.zeros([BLOCK_V], dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                h = tl.load(h_ptr + row * D + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
                w = tl.load(
                    w_ptr + offs_v[:, None] * D + offs_d[None, :],
                    mask=(offs_v[:, None] < V) & (offs_d[None, :] < D),
                    other=0.0,
                ).to(tl.float32)
                acc += tl.sum(w * h[None, :], axis=1)
            if ROUND_BF16:
                acc = acc.to(tl.bfloat16).to(tl.float32)
            acc = tl.where(offs_v < V, acc, float("-inf"))
            best = tl.max(acc, axis=0)
            index = tl.min(tl.where(acc == best, offs_v, V), axis=0)
            tl.store(max_ptr + row * NB + block, best)
            tl.store(idx_ptr + row * NB + block, index)

    @triton.jit
    def _dense_reduce(max_ptr, idx_ptr, flag_ptr, out_ptr, NB, BLOCK_B: tl.constexpr, SENTINEL: tl.constexpr):
        row = tl.program_id(0)
        flag = tl.load(flag_ptr)
        if flag != 0:
            offs = tl.arange(0, BLOCK_B)
            values = tl.load(max_ptr + row * NB + offs, mask=offs < NB, other=float("-inf"))
            indices = tl.load(idx_ptr + row * NB + offs, mask=offs < NB, other=SENTINEL)
            best = tl.max(values, axis=0)
            tl.store(out_ptr + row, tl.min(tl.where(values == best, indices, SENTINEL), axis=0).to(tl.int64))


def predicated_dense_argmax(
    hidden: torch.Tensor, weight: torch.Tensor, flag: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """When `flag` (0-dim bool, on the device) is set, write argmax(round(hidden @ weight.T)) per row into `out`
    (long [N]); otherwise leave `out` as it is. No host synchronisation."""
    if triton is None:
        raise MissingDependency("triton", extra="dev", image="vllm")
    n, d = hidden.shape
    vocab = weight.shape[0]
    blocks = triton.cdiv(vocab, BLOCK_V)
    maxima = torch.empty(n, blocks, dtype=torch.float32, device=hidden.device)
    indices = torch.empty(n, blocks, dtype=torch.int32, device=hidden.device)
    _dense_blocks[(n, blocks)](
        hidden.contiguous(),
        weight.contiguous(),
        flag,
        maxima,
        indices,
        vocab,
        d,
        blocks,
        BLOCK_V=BLOCK_V,
        BLOCK_D=BLOCK_D,
        ROUND_BF16=weight.dtype == torch.bfloat16,
    )
    _dense_reduce[(n,)](
        maxima, indices, flag, out, blocks, BLOCK_B=triton.next_power_of_2(blocks), SENTINEL=INDEX_SENTINEL
    )
    return out
