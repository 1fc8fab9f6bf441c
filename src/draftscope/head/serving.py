"""Serving the certified head inside an engine, whatever the engine: what the device must offer, the INT8 head
built in vocabulary chunks, the chunked coarse pass, the startup check, the dense reference contract, and
argmax-equivalent logits. Used by the vLLM plugin (`vllm_plugin`); nothing here knows vLLM.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from draftscope.head.certify import NO_DRAFT, certify
from draftscope.head.quant import Coarse, QuantizedHead, coarse

# Vocabulary rows per chunk. The build runs once, during vLLM's profiling run whose peak sizes the KV cache, and
# holds ~6 float64 copies of its chunk (~1 GB at 4096 × 5120); the coarse pass runs every step and converts its
# chunk of the INT8 head to fp32 (~335 MB at 16384 × 5120), fewer chunks meaning fewer kernel launches.
BUILD_CHUNK = 4096
VOCAB_CHUNK = 16384
REFERENCE_CONTRACT = (
    "cuBLAS bf16 reduced-precision reductions and split-K disabled around the target head's dense GEMM "
    "(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = (False, False))"
)


# --- prerequisites ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    cuda: bool
    name: str | None = None
    capability: tuple[int, int] | None = None
    bf16: bool = False
    toolkit: str | None = None  # torch.version.cuda
    arch_list: tuple[str, ...] = ()  # what torch was compiled for
    free_bytes: int | None = None
    total_bytes: int | None = None


def probe_device(hidden: torch.Tensor) -> DeviceFacts:
    """Facts about the device holding the head's inputs (no allocation)."""
    if hidden.device.type != "cuda":
        return DeviceFacts(cuda=False)
    index = hidden.device.index if hidden.device.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    return DeviceFacts(
        cuda=True,
        name=torch.cuda.get_device_name(index),
        capability=tuple(torch.cuda.get_device_capability(index)),  # type: ignore[arg-type]
        bf16=bool(torch.cuda.is_bf16_supported()),
        toolkit=torch.version.cuda,
        arch_list=tuple(torch.cuda.get_arch_list()),
        free_bytes=int(free),
        total_bytes=int(total),
    )


def device_missing(device: DeviceFacts, needed_bytes: int) -> list[str]:
    """What the device lacks for the certified head (empty: nothing)."""
    if not device.cuda:
        return ["the head's inputs are not on a CUDA device"]
    missing = []
    cap = device.capability or (0, 0)
    if cap < (8, 0):
        missing.append(f"compute capability {cap[0]}.{cap[1]} < 8.0")
    if not device.bf16:
        missing.append("the GPU has no bfloat16 support")
    if device.toolkit is None:
        missing.append("torch was built without the CUDA toolkit")
    elif not _runs_on(device.arch_list, cap):
        missing.append(
            f"toolkit mismatch: torch (CUDA {device.toolkit}) has no kernels for sm_{cap[0]}{cap[1]} "
            f"(built for {', '.join(device.arch_list) or 'nothing'})"
        )
    if device.free_bytes is not None and device.free_bytes < needed_bytes:
        missing.append(
            f"not enough free GPU memory for the INT8 head: {needed_bytes / 2**30:.2f} GiB needed, "
            f"{device.free_bytes / 2**30:.2f} GiB free"
        )
    return missing


def _runs_on(arch_list: tuple[str, ...], cap: tuple[int, int]) -> bool:
    """Whether torch carries a cubin for this exact GPU, or PTX it can JIT for it."""
    sm = cap[0] * 10 + cap[1]
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = "".join(c for c in number if c.isdigit())
        if not digits:
            continue
        if (kind == "sm" and int(digits) == sm) or (kind == "compute" and int(digits) <= sm):
            return True
    return False


def needed_bytes(vocab: int, hidden: int, groups: int, max_rows: int) -> int:
    """The INT8 copy and its tables, plus the largest transient of building it and of one certified step."""
    kept = vocab * hidden + 5 * 4 * vocab * groups
    build = 6 * 8 * min(vocab, BUILD_CHUNK) * hidden  # float64 copies of one chunk
    step = 8 * 8 * max_rows * vocab + 4 * min(vocab, VOCAB_CHUNK) * hidden  # float64 [rows, V]; fp32 chunk
    return int(1.1 * (kept + max(build, step)))


# --- building and checking --------------------------------------------------------------------------------------


def build_head(weight: torch.Tensor, group_size: int | None, chunk: int | None = None) -> QuantizedHead:
    """`QuantizedHead.build` one vocabulary chunk at a time (a bounded float64 transient)."""
    return QuantizedHead.build(weight, group_size, chunk_rows=chunk or BUILD_CHUNK)


def coarse_in_chunks(head: QuantizedHead, hidden: torch.Tensor, chunk: int | None = None) -> Coarse:
    """`quant.coarse` over vocabulary chunks: it would otherwise convert the whole INT8 head to fp32 per call.
    Sound whatever the chunking: the fp32 error term covers every accumulation order."""
    chunk = chunk or VOCAB_CHUNK
    if head.vocab <= chunk:
        return coarse(head, hidden)
    n = hidden.shape[0]
    logits = torch.empty(n, head.vocab, dtype=torch.float32, device=hidden.device)
    upper = torch.empty(n, head.vocab, dtype=torch.float64, device=hidden.device)
    a_bound = torch.empty_like(upper)
    for a in range(0, head.vocab, chunk):
        part = coarse(head.rows(a, min(a + chunk, head.vocab)), hidden)
        logits[:, a : a + chunk], upper[:, a : a + chunk], a_bound[:, a : a + chunk] = (
            part.logits,
            part.upper,
            part.a_bound,
        )
    return Coarse(logits, upper, a_bound)


def startup_rows(weight: torch.Tensor, rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic verification rows and draft tokens: random directions, rows aligned with a token's weights (so
    that some certify), one NaN row; the last row is the bonus row."""
    vocab, hidden = weight.shape
    gen = torch.Generator(device=weight.device).manual_seed(seed)
    h = torch.randn(rows, hidden, generator=gen, device=weight.device)
    picks = torch.randint(0, vocab, (rows,), generator=gen, device=weight.device)
    aligned = weight[picks].float()
    aligned = aligned * (math.sqrt(hidden) / aligned.norm(dim=1, keepdim=True).clamp_min(1e-30))
    half = torch.arange(rows, device=weight.device) % 2 == 1
    h = torch.where(half[:, None], aligned + 0.05 * h, h)
    if rows >= 4:
        h[rows // 2] = float("nan")
    draft = torch.where(half, picks, torch.randint(0, vocab, (rows,), generator=gen, device=weight.device))
    draft[-1] = NO_DRAFT
    return h.to(weight.dtype), draft


def startup_check(
    head: QuantizedHead,
    dense: Callable[[torch.Tensor], torch.Tensor],
    *,
    rows: int,
    k: int,
    out_dtype: torch.dtype,
    stages: Any = None,
) -> dict[str, Any]:
    """Certified vs the model's own dense head on synthetic rows; `disagreements` must be 0. `stages`: the
    implementation's `select.Stages` (the chunked reference coarse pass when None)."""
    started = time.perf_counter()
    hidden, draft = startup_rows(head.weight, rows)
    if stages is not None:
        extra = stages.certify_kwargs(head, hidden)
    else:
        extra = {"bounds": coarse_in_chunks(head, hidden)}
    cert = certify(head, hidden, draft, k=k, out_dtype=out_dtype, **extra)
    dense_tokens = dense(hidden).argmax(dim=-1)
    wrong = cert.certified & (cert.tokens != dense_tokens)
    return {
        "rows": rows,
        "certified": int(cert.certified.sum()),
        "disagreements": int(wrong.sum()),
        "seconds": round(time.perf_counter() - started, 6),
    }


@contextlib.contextmanager
def reference_contract(hidden: torch.Tensor) -> Iterator[None]:
    """The dense head's GEMM with fp32 reductions only (no bf16 reduced-precision reduction, no split-K)."""
    if hidden.device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    getter = getattr(torch._C, "_get_cublas_allow_bf16_reduced_precision_reduction", None)
    previous = tuple(getter()) if getter else (bool(matmul.allow_bf16_reduced_precision_reduction), True)
    matmul.allow_bf16_reduced_precision_reduction = (False, False)
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = previous


def argmax_equivalent(tokens: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Logits whose only finite entry per row (0) is at the row's token: every argmax picks it."""
    out = torch.full((tokens.shape[0], vocab), float("-inf"), dtype=dtype, device=tokens.device)
    return out.scatter_(1, tokens[:, None], 0.0)
