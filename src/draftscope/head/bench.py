"""`invoke head-bench`: latency of the dense bf16 head vs the certified path (coarse INT8 + top-K + refine) at
real shapes, side by side as ratios, with the bytes-moved floor of each.

For each vocabulary size and row count the dense head `hidden @ W.T` (bf16) and the certified path are timed in
alternation (so drift in a shared machine's load hits both), median of the repeats. The certified path is what a
verification step runs before its decision: the coarse GEMV over the INT8 weights, the upper bounds U, the top
K+4 tokens by U (C = top K+2 plus the draft token, and T, the best U outside C, is among the next two), and the
exact refine of the K+3 candidates. The O(rows·K) decision arithmetic is not timed. Expected cost at fallback rate
p is `path + p·dense`. The floor: dense reads 2·V·D bytes of weights, the certified path V·D (INT8) + scales and
error tables + the refined rows; at the dense head's measured bandwidth that many bytes take the time shown.

Implementations. CUDA: the Triton kernels (`triton_kernels`; the bounds are fused into the coarse pass). CPU:
`int8x8` (`cpu_coarse`: hidden rows quantized to INT8 too, torch's exact int8 GEMM, the activation error in U),
measured faster than both options below at 1, 8 and 16 rows; where `cpu_coarse.probe` finds torch's int8 GEMM
inexact on the CPU, the faster of these, chosen per shape and recorded:
- `int8pack`: `torch._weight_int8pack_mm` (fused dequantize, fp32 accumulation, bf16 output) with unit scales,
  then the fp32 per-row scale; the bf16 output rounding is covered by an extra `|c|·2^-8` in U;
- `tile`: dequantize tiles of rows to bf16 once and multiply every hidden row by each tile (bf16 output, same
  extra term).
Both need per-row scales (the default here). The bounds are then formed in torch with the coarse kernel's formula.

The weights are random (timing does not depend on their values); the INT8 head is built in row chunks
(`build_chunked`, identical to `QuantizedHead.build`, whose float64 temporaries would need ~10 GB at V=248320).

The report (`--output FILE`) follows schemas/head-bench.schema.json and describes itself: the kit's version and
git commit, the command as typed, the options as parsed, and the machine (GPU name, capability, driver and CUDA
versions; CPU model, CPU count and affinity, memory; torch, triton, Python; the load average before and after).
research/ keeps such reports as evidence/STUDY/measurements/NAME.json: `invoke evidence.add FILE.json --study NAME`
checks it against the study's frozen options (`draftscope.analysis.evidence`).

Over ~400 lines on purpose: the timing loop, the table and the report describe one measurement, and a study
freezes its protocol as a whole (research/studies/).
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from draftscope.core import hardware
from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.outputs import check_output_path
from draftscope.core.provenance import command_line, kit_info, now
from draftscope.core.schema import problems

log = logging.getLogger("draftscope.head.bench")

SCHEMA_VERSION = 1
K = 64  # candidates per row (certify.DEFAULT_K)
SEED = 0
CHUNK_ROWS = 8192  # rows quantized at once: ~2 GB of float64 temporaries at D = 5120
TILE_ROWS = 1024  # rows dequantized at once by the `tile` implementation (bf16: 10 MB at D = 5120, in L3)
BF16_OUT_REL = (
    2.0**-8
)  # |c|·2^-8 covers a bf16-rounded coarse output times an fp32 scale (see module docstring)


def _torch() -> Any:
    # lazy: torch, so the command line imports this module without it
    try:
        import torch
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch", extra="local", image="transformers") from None
    return torch


# --- parsing ------------------------------------------------------------------------------------------------


def parse_list(
    value: str | Sequence[Any], field: str, kind: type, *, low: float, high: float | None = None
) -> list:
    """`"1,8,16"` (or a sequence) → `[1, 8, 16]`, every item of `kind` within [low, high]."""
    items = [s.strip() for s in value.split(",") if s.strip()] if isinstance(value, str) else list(value)
    if not items:
        raise UserError(
            "needs at least one value", field=field, value=value, fix="give a comma-separated list"
        )
    out = []
    for item in items:
        try:
            number = kind(item)
        except (TypeError, ValueError):
            what = "an integer" if kind is int else "a number"
            raise UserError(f"expected {what} in the comma-separated list", field=field, value=item) from None
        if number < low or (high is not None and number > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise UserError(f"must be {bound}", field=field, value=item)
        out.append(number)
    return out


# --- the INT8 head, built in chunks -------------------------------------------------------------------------


def build_chunked(
    weight: Any,
    group_size: int | None = None,
    chunk_rows: int = CHUNK_ROWS,
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """`QuantizedHead.build` with this benchmark's chunk size and a progress callback."""
    # lazy: torch (head.quant and head.exact import it), as in `_torch()`
    from draftscope.head.quant import QuantizedHead

    return QuantizedHead.build(weight, group_size, chunk_rows=chunk_rows, progress=progress)


def head_rows(head: Any, vocab: int) -> Any:
    """The head of the first `vocab` rows (views; rows are quantized independently)."""
    return head.rows(0, vocab)


def random_weight(
    vocab: int, hidden: int, device: str, seed: int = SEED, chunk_rows: int = CHUNK_ROWS
) -> Any:
    """A random bf16 head [vocab, hidden] (std 0.02, like an LM head), generated in chunks."""
    torch = _torch()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    weight = torch.empty(vocab, hidden, dtype=torch.bfloat16, device=device)
    for start in range(0, vocab, chunk_rows):
        rows = min(chunk_rows, vocab - start)
        weight[start : start + rows] = (torch.randn(rows, hidden, generator=gen) * 0.02).to(torch.bfloat16)
    return weight


# --- CPU implementations ------------------------------------------------------------------------------------


def coarse_int8pack(head: Any, hidden: Any, ones: Any) -> Any:
    """c fp32 [N, V] = bf16(Σ_i h_i q_ji) · scale_j, by torch's fused INT8 weight-only matmul (per-row scales)."""
    torch = _torch()
    return torch._weight_int8pack_mm(hidden.to(torch.bfloat16), head.q, ones).float() * head.scales[:, 0]


def coarse_tile(head: Any, hidden: Any, _ones: Any = None, tile_rows: int = TILE_ROWS) -> Any:
    """The same product by tiles: each tile of INT8 rows is dequantized to bf16 once and used for every row."""
    torch = _torch()
    h = hidden.to(torch.bfloat16)
    out = torch.empty(
        head.vocab, h.shape[0], dtype=torch.bfloat16
    )  # [V, N]: each tile writes contiguous rows
    tile = torch.empty(min(tile_rows, head.vocab), head.hidden, dtype=torch.bfloat16)
    for start in range(0, head.vocab, tile_rows):
        q = head.q[start : start + tile_rows]
        buf = tile[: q.shape[0]]
        buf.copy_(q)  # INT8 → bf16 is exact
        torch.mm(buf, h.T, out=out[start : start + q.shape[0]])
    return out.T.float() * head.scales[:, 0]


CPU_COARSE = {"int8pack": coarse_int8pack, "tile": coarse_tile}
INT8X8 = "int8x8"  # `head.cpu_coarse`: INT8 activations × INT8 weights, the CPU coarse pass where it is exact
_INT8: dict[tuple, Any] = {}  # a head's INT8 weights (address, shape) → its Int8Coarse, None where not exact


def int8_coarse(head: Any) -> Any:
    """The head's `cpu_coarse.Int8Coarse` (built once per head), or None where torch's int8 GEMM is not exact on
    this CPU (then the faster of `CPU_COARSE` runs)."""
    # lazy: torch (head.cpu_coarse imports it), as in `_torch()`
    from draftscope.head.cpu_coarse import Int8Coarse

    key = (head.q.data_ptr(), tuple(head.q.shape), head.group_size)
    if key not in _INT8:
        _INT8[key] = Int8Coarse.build(head) if Int8Coarse.available(head) else None
    return _INT8[key]


def bounds_torch(head: Any, hidden: Any, c: Any, extra_rel: float = 0.0) -> tuple[Any, Any]:
    """(U float64 [N, V], A_out float64 [N]) from the coarse logits `c`, with the coarse kernel's formula: fp32
    group sums made upper bounds, U = c + e·pad + |c|·(2^-50 + extra_rel). `extra_rel` covers a coarse output
    rounded to bf16. A_out = Σ_g ‖h_g‖₁ · max_j w_linf[j, g] ≥ every token's A bound (the tail needs its max)."""
    torch = _torch()
    # lazy: torch (head.quant and head.exact import it), as in `_torch()`
    from draftscope.head.exact import PAD, gamma, up_to_f32
    from draftscope.head.quant import group_norms

    g = head.groups
    l1, l2 = group_norms(hidden, head.group_size)
    l1f, l2f = up_to_f32(l1).float(), up_to_f32(l2).float()
    gamma_fp = float(up_to_f32(torch.tensor(gamma(head.hidden + g + 1), dtype=torch.float64)))
    e = torch.zeros_like(c)
    e_quant, e_fp = torch.empty_like(c), torch.empty_like(c)
    for j in range(g):  # the kernel's per-group sum, in the same order; in place (these are [N, V] arrays)
        torch.mul(head.err_l2[None, :, j], l2f[:, j, None], out=e_quant)
        torch.mul(head.err_linf[None, :, j], l1f[:, j, None], out=e_fp)
        torch.minimum(e_quant, e_fp, out=e_quant)
        torch.mul(head.q_linf[None, :, j], l1f[:, j, None], out=e_fp)
        e += e_quant.add_(e_fp.mul_(gamma_fp))
    upper = c.double()
    upper.add_(e.double().mul_((1 + PAD) / (1 - gamma(g + 4))))
    upper.add_(c.abs().double().mul_(2.0**-50 + extra_rel))  # U = (c + e·pad) + |c|·k, the kernel's order
    a_out = (l1 * head.w_linf.double().amax(dim=0)[None]).sum(dim=1) * ((1 + PAD) / (1 - gamma(g + 1)))
    return upper, a_out


def refine_fp32(weight: Any, hidden: Any, ids: Any) -> tuple[Any, Any]:
    """`certify.refine` with A in fp32 (batched matmuls), divided by 1 − γ_{D+1}: an upper bound like the Triton
    refine's; f is the fp32 dot."""
    torch = _torch()
    # lazy: torch (head.quant and head.exact import it), as in `_torch()`
    from draftscope.head.exact import PAD, gamma

    w = weight[ids].float()  # [N, m, D]
    h = hidden.float()[:, :, None]
    f = torch.bmm(w, h)[:, :, 0]
    a = torch.bmm(w.abs_(), h.abs())[:, :, 0]
    return f.double(), a.double() * ((1 + PAD) / (1 - gamma(weight.shape[1] + 1)))


# --- timing -------------------------------------------------------------------------------------------------


class Timer:
    """Wall time of a callable; on CUDA the device is synchronized before and after."""

    def __init__(self, device: str) -> None:
        self.torch = _torch()
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if self.cuda:
            self.torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3


def _cpu_coarse(head: Any, hidden: Any, coarse_impl: str) -> tuple[Callable[[], Any], Callable[[Any], Any]]:
    """The CPU coarse pass as two phases: (the coarse values, then their bounds U from those values)."""
    if coarse_impl == INT8X8:
        int8 = int8_coarse(head)

        def int8_logits() -> Any:
            q_h, s_h, norms = int8.quantize(hidden)
            return int8.logits(q_h, s_h), norms

        return int8_logits, lambda c: int8.bounds(c[0], int8.coefficients(c[1]))
    torch = _torch()
    ones = torch.ones(head.vocab, dtype=torch.bfloat16)
    fn = CPU_COARSE[coarse_impl]
    return lambda: fn(head, hidden, ones), lambda c: bounds_torch(head, hidden, c, BF16_OUT_REL)[0]


def _path_ops(
    device: str, head: Any, weight: Any, hidden: Any, draft: Any, coarse_impl: str
) -> dict[str, Any]:
    """The certified path's phases as callables (each phase's input computed once for timing it alone), and the
    whole path end to end."""
    torch = _torch()
    if device == "cuda":
        # lazy: torch and triton, only on CUDA
        from draftscope.head.triton_kernels import coarse_triton, refine_triton, topk_triton

        def coarse() -> Any:
            return coarse_triton(head, hidden).upper

        def topk(upper: Any) -> Any:
            return topk_triton(upper, K + 4)[1]

        refine = refine_triton
    else:
        coarse_logits, bounds = _cpu_coarse(head, hidden, coarse_impl)

        def coarse() -> Any:
            return bounds(coarse_logits())

        def topk(upper: Any) -> Any:
            return torch.topk(upper, K + 4, dim=1).indices

        refine = refine_fp32

    def candidates(top: Any) -> Any:
        return torch.cat([top[:, : K + 2], draft[:, None]], dim=1)

    def path() -> Any:
        return refine(weight, hidden, candidates(topk(coarse())))

    upper = coarse()
    ids = candidates(topk(upper))
    phases = {"coarse": coarse}
    if device != "cuda":  # on CUDA the bounds are fused into the coarse kernel
        logits = coarse_logits()
        phases = {"coarse": coarse_logits, "bounds": lambda: bounds(logits)}
    return {
        **phases,
        "topk": lambda: topk(upper),
        "refine": lambda: refine(weight, hidden, ids),
        "path": path,
    }


def measure(device: str, head: Any, weight: Any, rows: int, repeats: int, seed: int = SEED) -> dict[str, Any]:
    """Median times (ms) of the dense head and of the certified path at one shape, and the samples."""
    torch = _torch()
    gen = torch.Generator(device="cpu").manual_seed(seed + rows)
    hidden = torch.randn(rows, head.hidden, generator=gen).to(torch.bfloat16).to(device)
    draft = torch.randint(0, head.vocab, (rows,), generator=gen).to(device)
    timer = Timer(device)

    def dense() -> Any:
        return hidden @ weight.T

    candidates_ms: dict[str, float] = {}
    if device == "cuda":
        impl = {"coarse": "triton", "topk": "triton", "refine": "triton", "dense": "torch bf16 matmul"}
        ops = _path_ops(device, head, weight, hidden, draft, "triton")
    elif int8_coarse(head) is not None:
        impl = {"coarse": INT8X8, "topk": "torch.topk", "refine": "fp32 bmm", "dense": "torch bf16 matmul"}
        ops = _path_ops(device, head, weight, hidden, draft, INT8X8)
    else:
        # Pick the coarse implementation by a quick measurement (one warm-up, one timed run each).
        for name in CPU_COARSE:
            probe = _path_ops(device, head, weight, hidden, draft, name)["coarse"]
            probe()
            candidates_ms[name] = timer(probe)
        best = min(candidates_ms, key=candidates_ms.__getitem__)
        impl = {"coarse": best, "topk": "torch.topk", "refine": "fp32 bmm", "dense": "torch bf16 matmul"}
        ops = _path_ops(device, head, weight, hidden, draft, best)
    phases = {"dense": dense, **ops}
    for fn in phases.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {name: [] for name in phases}
    for _ in range(repeats):
        for name, fn in phases.items():  # alternate, so load drift hits every phase alike
            samples[name].append(timer(fn))
    return {
        "impl": impl,
        "median_ms": {name: statistics.median(ts) for name, ts in samples.items()},
        "min_ms": {
            name: min(ts) for name, ts in samples.items()
        },  # less sensitive to a shared machine's load
        "samples_ms": samples,
        "candidates_ms": candidates_ms,
    }


def summarize(
    vocab: int, rows: int, hidden: int, head: Any, timing: dict[str, Any], fallback: Sequence[float]
) -> dict[str, Any]:
    """Ratios, expected cost at each fallback rate, and the bytes-moved floor, from measured medians."""
    med = timing["median_ms"]
    dense_bytes = 2 * vocab * hidden
    refine_bytes = 2 * rows * (K + 3) * hidden
    certified_bytes = head.bytes_int8 + refine_bytes
    bandwidth = dense_bytes / (med["dense"] * 1e-3)  # bytes/s the dense head achieved
    floor = {"dense": dense_bytes / bandwidth * 1e3, "certified": certified_bytes / bandwidth * 1e3}
    return {
        "vocab": vocab,
        "rows": rows,
        "impl": timing["impl"],
        "median_ms": med,
        "min_ms": timing["min_ms"],
        "samples_ms": timing["samples_ms"],
        "candidates_ms": timing["candidates_ms"],
        "ratio": med["path"] / med["dense"],
        "expected_ratio": {f"{p:g}": (med["path"] + p * med["dense"]) / med["dense"] for p in fallback},
        "bytes": {
            "dense": dense_bytes,
            "certified": certified_bytes,
            "int8_head": head.bytes_int8,
            "refine": refine_bytes,
        },
        "dense_bandwidth_gbs": bandwidth / 1e9,
        "floor_ms": floor,
        "floor_ratio": certified_bytes / dense_bytes,
    }


# --- report -------------------------------------------------------------------------------------------------


def table(results: Sequence[dict[str, Any]], fallback: Sequence[float], device: str) -> Any:
    """One row per (vocab, rows): phase medians in ms, then ratios to the dense head, then the bytes floor."""
    t = Table(
        title=f"head-bench on {device}: dense bf16 head vs certified path (coarse INT8 + bounds + top-K + "
        "refine); times in ms, medians",
        title_justify="left",
    )
    rates = [p for p in fallback if p != 0]  # p = 0 is the path/dense column
    cols = ["vocab", "rows", "dense", "coarse", "bounds", "top-K", "refine", "path", "path/dense"]
    cols += [f"+{p:g}·dense" for p in rates] + ["GB dense→cert.", "bytes ratio", "floor", "coarse impl"]
    for col in cols:
        t.add_column(col, justify="left" if col == "coarse impl" else "right")
    for r in results:
        m = r["median_ms"]
        bounds = f"{m['bounds']:.1f}" if "bounds" in m else "fused"
        t.add_row(
            str(r["vocab"]),
            str(r["rows"]),
            *(f"{m[k]:.1f}" for k in ("dense", "coarse")),
            bounds,
            *(f"{m[k]:.1f}" for k in ("topk", "refine", "path")),
            f"{r['ratio']:.2f}×",
            *(f"{r['expected_ratio'][f'{p:g}']:.2f}×" for p in rates),
            f"{r['bytes']['dense'] / 1e9:.2f}→{r['bytes']['certified'] / 1e9:.2f}",
            f"{r['floor_ratio']:.2f}×",
            f"{r['floor_ms']['certified']:.1f}",
            r["impl"]["coarse"],
        )
    return t


def validate_report(report: dict[str, Any]) -> None:
    """The report against schemas/head-bench.schema.json; a failure is a bug in this module, not user input."""
    found = problems(report, "head-bench")
    if found:
        raise RuntimeError(f"head-bench report: {found[0].path}: {found[0].message}")


# The CPU features a bf16 or INT8 matmul's speed depends on, as /proc/cpuinfo names them.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def _cpu_model() -> tuple[str, list[str]]:
    """The CPU's model name and which of CPU_FEATURES it has (Linux; elsewhere the platform's name and [])."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), [f for f in CPU_FEATURES if f in flags]


def _memory_mib() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            return next(int(ln.split()[1]) // 1024 for ln in fh if ln.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        return None


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _gpu_info(torch: Any) -> dict[str, Any]:
    """torch's view of GPU 0, with the driver version from NVML or nvidia-smi where either answers."""
    props = torch.cuda.get_device_properties(0)
    gpu: dict[str, Any] = {
        "name": props.name,
        "capability": [props.major, props.minor],
        "memory_mib": props.total_memory // 2**20,
        "multiprocessors": props.multi_processor_count,
        "count": torch.cuda.device_count(),
        "driver": None,
        "driver_cuda": None,
        "clocks_sm_max_mhz": None,
    }
    try:
        found = hardware.gpus_from_nvml() or hardware.gpus_from_nvidia_smi()
    except Exception:  # the driver's facts are a nice-to-have; torch gave the essentials
        found = None
    if found:
        gpu.update(
            driver=found[0].driver_version,
            driver_cuda=found[0].cuda_version,
            clocks_sm_max_mhz=found[0].clocks_sm_max_mhz,
        )
    return gpu


def _device_info(device: str, load_start: float | None = None) -> dict[str, Any]:
    """The machine, for a self-describing report: device, CPU, memory, software versions, load average."""
    torch = _torch()
    # lazy: triton is optional here (only its version is reported)
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    cpu, features = _cpu_model()
    gpu = _gpu_info(torch) if device == "cuda" else None
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "type": device,
        "name": gpu["name"] if gpu else cpu,
        "cpu_model": cpu,
        "cpu_features": features,
        "cpus": os.cpu_count(),
        "affinity": affinity,
        "threads": torch.get_num_threads(),
        "memory_mib": _memory_mib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "gpu": gpu,
        "load_average": {"start": load_start, "end": _load()},
    }


def _check_memory(device: str, vocab: int, hidden: int) -> None:
    need = (
        3 * vocab * hidden + 2 * CHUNK_ROWS * hidden * 8 * 6
    )  # weights + INT8 + a chunk's float64 temporaries
    if device == "cpu":
        try:
            with open("/proc/meminfo", encoding="utf-8") as fh:
                avail = next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable"))
        except (OSError, StopIteration):
            return
        if need > avail:
            raise UserError(
                f"needs ~{need / 2**30:.1f} GiB of memory, {avail / 2**30:.1f} GiB available",
                field="vocab",
                value=vocab,
                fix="run fewer or smaller vocabularies",
            )


def main(
    device: str = "cpu",
    vocab: str | Sequence[int] = "151936,248320",
    hidden: int = 5120,
    rows: str | Sequence[int] = "1,8,16",
    fallback: str | Sequence[float] = "0,0.1,0.45",
    repeats: int = 3,
    output: str | Path | None = None,
    *,
    quiet: bool = False,
    show: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark, show progress and the table through `show` (the caller's printer: the head is a library
    and prints nothing itself), write `output` (JSON) when given; returns the report."""
    if device not in ("cpu", "cuda"):
        raise UserError("unknown device", field="device", value=device, fix="use cpu or cuda")
    vocabs = parse_list(vocab, "vocab", int, low=K + 4)
    row_counts = parse_list(rows, "rows", int, low=1)
    rates = parse_list(fallback, "fallback", float, low=0.0, high=1.0)
    if int(hidden) < 1:
        raise UserError("must be positive", field="hidden", value=hidden)
    if int(repeats) < 1:
        raise UserError("must be at least 1", field="repeats", value=repeats)
    out_path = Path(output) if output else None
    if out_path is not None and not out_path.parent.is_dir():
        raise UserError(
            "the output's folder does not exist",
            field="output",
            value=str(output),
            fix="create the folder first",
        )
    if out_path is not None:
        check_output_path(out_path, "--output")
        if out_path.exists() or out_path.is_symlink():
            raise UserError(
                "already exists; head-bench reports are never overwritten",
                field="--output",
                value=str(output),
                fix="choose a new file name",
            )
    torch = _torch()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                "CUDA is not available here", field="device", value=device, fix="use --device cpu"
            )
        # lazy: torch and triton, only on CUDA
        from draftscope.head.triton_kernels import kernels

        kernels()  # MissingDependency now, not after building the heads
        # The dense reference's settings (docs/review/head.md): no reduced-precision bf16 reduction.
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    _check_memory(device, max(vocabs), int(hidden))

    say = (lambda *_: None) if quiet or show is None else show
    started = time.perf_counter()
    load_start = _load()
    big = max(vocabs)
    say(
        f"head-bench: random bf16 head {big}×{hidden} on {device}, INT8 per-row scales (chunks of {CHUNK_ROWS})"
    )
    weight = random_weight(big, int(hidden), device)
    full = build_chunked(weight, None)
    say(f"  built in {time.perf_counter() - started:.1f} s")
    results = []
    for v in vocabs:
        head = head_rows(full, v)
        for n in row_counts:
            timing = measure(device, head, head.weight, n, int(repeats))
            results.append(summarize(v, n, int(hidden), head, timing, rates))
            log.info("vocab %d rows %d: %s", v, n, timing["median_ms"])
    notes = [
        "times: median of the repeats; dense and path phases measured in alternation",
        "path = coarse GEMV + bounds U + top-(K+4) + refine of K+3 candidates, timed end to end; the decision "
        "arithmetic is O(rows·K) and not timed",
        "+p·dense: expected cost (path + p·dense) / dense at fallback rate p",
        "bytes: weights only (bf16 dense vs INT8 + fp32 scales and 4 error tables + refined bf16 rows); floor: the "
        "certified path's bytes at the dense head's measured bandwidth",
        f"random weights, seed {SEED}; K = {K}; per-row INT8 scales",
    ]
    if device == "cpu" and all(r["impl"]["coarse"] == INT8X8 for r in results):
        notes.append(
            "CPU coarse: int8x8 (head.cpu_coarse): hidden rows quantized to INT8 per row, torch._int_mm's exact "
            "int32 sums, fp32 scales; U adds the activation error δ·ŵ, the fp32 roundings and the bounds' addmm"
        )
    elif device == "cpu":
        notes.append(
            "CPU coarse: the faster of torch._weight_int8pack_mm and bf16 tile-dequantize per shape "
            "(candidates_ms; torch._int_mm was not exact here); both round c to bf16, covered by an extra |c|·2^-8 "
            "in U"
        )
    machine = _device_info(device, load_start)
    if device == "cpu":
        load = machine["load_average"]
        notes.append(
            f"shared CPU: 1-minute load average {load['start']} before the heads were built, "
            f"{load['end']} at the end, on {machine['affinity']} usable CPU(s)"
        )
    report = {
        "schema_version": SCHEMA_VERSION,
        "kind": "head-bench",
        "created": now(),
        "kit": kit_info(),
        "command": command_line(),
        "device": machine,
        "config": {
            "device": device,
            "vocab": vocabs,
            "hidden": int(hidden),
            "rows": row_counts,
            "fallback": rates,
            "repeats": int(repeats),
            "k": K,
            "group_size": int(hidden),
            "seed": SEED,
        },
        "results": results,
        "notes": notes,
        "seconds": round(time.perf_counter() - started, 3),
    }
    validate_report(report)
    if not quiet:
        say(table(results, rates, device))
        for note in notes:
            say(f"  note: {note}")
    if out_path is not None:
        atomic_write_json(out_path, report)
        say(f"  wrote {out_path}")
    return report
