"""The head's Triton kernels compiled ahead of time, per CUDA capability, without a GPU (the vllm image's build step).

What is compiled is what the engine plugin launches: the cuda-graph and cuda-triton implementations run
`certify` with the `triton_kernels` stages (coarse, top-K keys and merge, refine; `select.stages`), on the target's
head — `[vocab, hidden]` in the model's dtype, INT8 weights with `groups` scales per row — for every row count up to
`max_rows` (the eager path), the graph buckets and the startup check. The PredicatedHead's `graph_kernels` are an
ablation the plugin never builds, so they are left out.

How: the same `certify` call runs on *meta* tensors (shapes and dtypes, no data, `data_ptr() == 0` — as aligned as
the caching allocator's real blocks) under a stand-in Triton driver (`StandInDriver`) whose current target is
`GPUTarget("cuda", arch, 32)`. The launches then go through Triton's own JIT path (`JITFunction.run`): its binder
specializes every argument as at run time (pointer alignment, ints divisible by 16, ints equal to 1 as constexprs,
the constexprs), the options are the defaults the wrappers launch with, the key includes the cache-invalidating
environment — so the cache entries are exactly those the engine's JIT will look up, with no list of signatures kept
by hand beside the wrappers. The stand-in's "load" checks what a GPU-less machine can (the cubin is an ELF for the
right SM, the kernel's shared memory fits the capability's per-block limit) and its launcher never runs anything.

Each capability compiles in a fresh spawned process (Triton keeps one target per device and process), then a second
fresh process replays every launch with compiling and cache writes made to fail (`_forbid_compiling`): each launch
must be a cache hit, and the folder's file list must not change. The manifest (`triton_cache.manifest`) is written
only after both checks and the per-entry file checks (`triton_cache.cache_problems`) pass.

Triton 3.9 here and 3.8 in the vllm image share every API used (`JITFunction.run`/`warmup`, `driver.set_active`,
`CompiledKernel._init_handles` calling `launcher_cls(src, metadata)` and `utils.load_binary`); 3.8 reads the warp
size from the driver's target, 3.9 from the metadata — the stand-in serves both.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.head import select, triton_cache
from draftscope.head import triton_kernels as tk
from draftscope.head.certify import certify
from draftscope.head.graph import BUCKETS, bucket_for
from draftscope.head.quant import QuantizedHead
from draftscope.head.vllm_switch import DEFAULT_K, DEFAULT_MAX_ROWS

# Shared memory a block may opt into, per capability (CUDA C Programming Guide, "Technical Specifications per Compute
# Capability"): what Triton compares a kernel's `shared` with before loading it (`max_shared_mem`).
MAX_SHARED = {
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    103: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}
MAX_THREADS = 1024  # per block, every capability since 2.0
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Geometry:
    """A target head as the plugin sees it: vocabulary rows, hidden size, dtype, and the plugin's settings that shape
    the launches (K, max_rows, group size: `vllm_switch.Settings`)."""

    vocab: int
    hidden: int
    dtype: str = "bfloat16"
    group_size: int | None = None
    k: int = DEFAULT_K
    max_rows: int = DEFAULT_MAX_ROWS
    source: str = ""  # the model preset it comes from, if any

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserError("not a head dtype", field="dtype", value=self.dtype, fix=f"use one of {DTYPES}")
        for name in ("vocab", "hidden", "k", "max_rows"):
            if getattr(self, name) <= 0:
                raise UserError("must be positive", field=name, value=str(getattr(self, name)))
        if self.group_size is not None and (self.group_size <= 0 or self.hidden % self.group_size):
            raise UserError(
                "the group size must divide the hidden size",
                field="group_size",
                value=str(self.group_size),
                fix=f"pass a divisor of {self.hidden}, or none (one scale per row)",
            )

    def rows(self) -> list[int]:
        """Every row count the plugin can certify: 1…max_rows (eager), the graph buckets up to max_rows' bucket."""
        rows = set(range(1, self.max_rows + 1))
        if self.max_rows <= BUCKETS[-1]:
            rows |= {b for b in BUCKETS if b <= bucket_for(self.max_rows)}
        return sorted(rows)


def preset_geometries(
    names: list[str] | None = None, *, k: int = DEFAULT_K, max_rows: int = DEFAULT_MAX_ROWS, group_size=None
) -> list[Geometry]:
    """The geometries of model presets (default: every hub preset, the models the vllm image serves)."""
    from draftscope.core import presets  # lazy: yaml and the schemas, only when presets are read

    chosen = names or [
        n for n in presets.model_preset_names() if presets.load_model_preset(n).source == "hub"
    ]
    out = []
    for name in chosen:
        arch = presets.load_model_preset(name).architecture
        if not arch.hidden_size:
            raise UserError(
                "the preset has no hidden_size", field="--model", value=name, fix="pass --geometry V:D"
            )
        out.append(Geometry(arch.vocab_size, arch.hidden_size, "bfloat16", group_size, k, max_rows, name))
    return out


# --- the launches ---------------------------------------------------------------------------------------------


def trace(geometry: Geometry) -> None:
    """Run the plugin's certify step, on meta tensors, for every row count: each Triton launch it makes goes
    through the active driver (the stand-in's: compile or hit, "load", no-op launch)."""
    meta = torch.device("meta")
    dtype = getattr(torch, geometry.dtype)
    v, d = geometry.vocab, geometry.hidden
    gs = geometry.group_size or d
    groups = d // gs

    def table() -> torch.Tensor:
        return torch.empty(v, groups, dtype=torch.float32, device=meta)

    weight = torch.empty(v, d, dtype=dtype, device=meta)
    q = torch.empty(v, d, dtype=torch.int8, device=meta)
    head = QuantizedHead(weight, q, table(), gs, table(), table(), table(), table())
    impl = select.Implementation("cuda-graph", "triton", graph=True, reason=None)
    # The captured stages (top-K without its host-side repair: data-dependent, and it launches no kernel).
    stages = select.stages(impl, meta, capturable=True)
    for n in geometry.rows():
        hidden = torch.empty(n, d, dtype=dtype, device=meta)
        draft = torch.empty(n, dtype=torch.long, device=meta)
        certify(head, hidden, draft, k=geometry.k, out_dtype=dtype, **stages.certify_kwargs(head, hidden))


class _Utils:
    """The driver utilities `CompiledKernel._init_handles` calls: the "load" checks the cubin instead."""

    def __init__(self, owner: StandInDriver) -> None:
        self.owner = owner

    def get_device_properties(self, device: int) -> dict[str, int]:
        shared = MAX_SHARED.get(self.owner.arch, 1 << 30)
        return {"max_shared_mem": shared, "multiprocessor_count": 1, "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[Any, ...]:
        entry = self.owner.loaded[-1]  # the launcher made just before, for this kernel
        sm = triton_cache.cubin_sm(kernel)
        if sm != self.owner.arch or entry["kernel"] != name:
            raise RuntimeError(f"{name}: the cubin is for sm {sm}, not {self.owner.arch}")
        entry["cubin_sha256"] = hashlib.sha256(kernel).hexdigest()
        return object(), object(), 0, 0, MAX_THREADS  # module, function, registers, spills, max threads

    def unload_module(self, module: Any) -> None:
        pass


class _Launcher:
    """`launcher_cls(src, metadata)`: records the kernel instance; calling it launches nothing."""

    def __init__(self, owner: StandInDriver, src: Any, metadata: Any) -> None:
        self.owner = owner
        now = time.perf_counter()
        names = src.fn.arg_names
        owner.loaded.append(
            {
                "kernel": metadata.name,
                "arch": metadata.target.arch,
                "target": None,  # set from the PTX by build()
                "specialization": {
                    "signature": {k: str(v) for k, v in src.signature.items() if v != "constexpr"},
                    "constexprs": {names[k[0]]: _plain(v) for k, v in sorted(src.constants.items())},
                    "attrs": {names[k[0]]: _plain(v) for k, v in sorted(src.attrs.items()) if v},
                },
                "cache_key": metadata.hash,
                "key_dir": triton_cache.key_dir(metadata.hash),
                "shared": int(metadata.shared),
                "num_warps": int(metadata.num_warps),
                "num_stages": int(metadata.num_stages),
                # The time since the previous launch: the meta-tensor work between is microseconds, so this is the
                # compile (or, on a hit, the cache read).
                "compile_seconds": round(now - owner.last, 3),
            }
        )

    def __call__(self, *args: Any) -> None:
        self.owner.launches += 1
        self.owner.last = time.perf_counter()


def _plain(value: Any) -> Any:
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


class StandInDriver:
    """A Triton driver for a GPU of capability `arch` that is not there: the JIT path runs up to the launch."""

    def __init__(self, arch: int) -> None:
        self.arch = arch
        self.utils = _Utils(self)
        self.launcher_cls = functools.partial(_Launcher, self)
        self.loaded: list[dict[str, Any]] = []
        self.launches = 0
        self.last = time.perf_counter()

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget  # lazy: triton (the caller has imported it)

        return GPUTarget("cuda", self.arch, 32)

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("meta")

    @staticmethod
    def is_active() -> bool:
        return False


class CacheMiss(RuntimeError):
    """Raised, in the replay, where Triton would compile or write into the cache."""


def _forbid_compiling() -> None:
    # lazy: triton (the replay's process has it)
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.cache import FileCacheManager

    def no_compile(*args: Any, **kwargs: Any) -> None:
        raise CacheMiss("Triton started compiling: the kernel instance is not in the cache")

    def no_write(self: Any, data: Any, filename: str, binary: bool = True) -> str:
        raise CacheMiss(f"Triton tried to write {filename} into the cache")

    # add_stages is the first thing compile() does after the cache lookup missed; put() every write to the cache.
    CUDABackend.add_stages = no_compile
    FileCacheManager.put = no_write


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def run_arch(arch: int, geometries: list[Geometry], cache_dir: str, replay: bool = False) -> dict[str, Any]:
    """In a fresh process: every geometry's launches for capability `arch` under the stand-in driver, compiling into
    `cache_dir` — or, with `replay`, only reading it (`_forbid_compiling`). Returns what was loaded."""
    settings.TRITON_CACHE_DIR.set(cache_dir)  # read by Triton at each lookup (knobs.cache.dir)
    triton, _ = tk._triton()
    from triton._C.libtriton import get_cache_invalidating_env_vars  # lazy: triton

    if tk.interpreting():
        raise UserError("compiling needs the real Triton JIT", fix="unset TRITON_INTERPRET for this process")
    driver = StandInDriver(arch)
    triton.runtime.driver.set_active(driver)
    before = _listing(Path(cache_dir)) if replay else []
    if replay:
        _forbid_compiling()
    started = time.perf_counter()
    for geometry in geometries:
        try:
            trace(geometry)
        except CacheMiss as exc:
            done = {e["kernel"] for e in driver.loaded}
            raise CacheMiss(f"sm_{arch} {geometry}: {exc} (hits so far: {sorted(done)})") from None
    return {
        "arch": arch,
        "loaded": driver.loaded,
        "launches": driver.launches,
        "seconds": round(time.perf_counter() - started, 3),
        "env": dict(get_cache_invalidating_env_vars()),
        "triton_version": triton.__version__,
        "listing_unchanged": (_listing(Path(cache_dir)) == before) if replay else None,
    }


def _in_fresh_processes(archs: list[int], jobs: int, *args: Any, replay: bool) -> list[dict[str, Any]]:
    # spawn, not fork: a fresh interpreter has no Triton JIT state (kernel caches, the active driver) to inherit.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(run_arch, arch, *args, replay=replay) for arch in archs]
        return [f.result() for f in futures]


def build(
    archs: list[int], cuda_arch: str, cache_dir: Path, geometries: list[Geometry], jobs: int | None = None
) -> dict[str, Any]:
    """Compile for every capability in `archs` into `cache_dir`, check, and write the manifest; returns it, with the
    times under `seconds` (not written).

    `cache_dir` must be the folder the engine seeds from (Triton's group files name absolute paths)."""
    if not geometries:
        raise UserError(
            "no geometry to compile for", field="--model", fix="name a model preset or --geometry V:D"
        )
    cache_dir = Path(cache_dir).absolute()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create the cache folder: {exc.strerror}", field="--cache-dir", value=str(cache_dir)
        ) from None
    jobs = max(1, min(len(archs), jobs or os.cpu_count() or 1))
    compiled = _in_fresh_processes(archs, jobs, geometries, str(cache_dir), replay=False)
    try:
        replayed = _in_fresh_processes(archs, jobs, geometries, str(cache_dir), replay=True)
    except CacheMiss as exc:
        raise UserError(
            f"the AOT cache does not hit: {exc}", field="--cache-dir", value=str(cache_dir)
        ) from None
    entries = {(e["arch"], e["cache_key"]): e for r in compiled for e in r["loaded"]}
    for entry in entries.values():  # the PTX's own `.target` (Triton's options say only "sm90")
        ptx = cache_dir / entry["key_dir"] / f"{entry['kernel']}.ptx"
        entry["target"] = triton_cache.ptx_target(ptx.read_text(encoding="utf-8")) if ptx.is_file() else None
    problems = []
    for first, again in zip(compiled, replayed, strict=True):
        keys = {e["cache_key"] for e in first["loaded"]}
        hits = {e["cache_key"] for e in again["loaded"]}
        if hits != keys or not again["listing_unchanged"] or first["env"] != again["env"]:
            problems.append(f"sm_{first['arch']}: the replay loaded {len(hits)} of {len(keys)} entries")
    data = triton_cache.manifest(
        entries.values(),
        triton_version=compiled[0]["triton_version"],
        cuda_arch=cuda_arch,
        geometries=[asdict(g) for g in geometries],
        env=compiled[0]["env"],
        replay={str(r["arch"]): {"hits": len(r["loaded"]), "launches": r["launches"]} for r in replayed},
    )
    problems += triton_cache.cache_problems(cache_dir, data)
    if problems:
        raise UserError(
            f"the AOT cache failed its check ({len(problems)} problems): {problems[0]}",
            field="--cache-dir",
            value=str(cache_dir),
        )
    triton_cache.write_manifest(cache_dir, data)
    # Times for the build's log only (the manifest stays byte-reproducible): per capability, and per entry.
    data["seconds"] = {
        "compile": {str(r["arch"]): r["seconds"] for r in compiled},
        "replay": {str(r["arch"]): r["seconds"] for r in replayed},
        "entries": {
            f"{e['kernel']} sm_{e['arch']} {e['key_dir'][:8]}": e["compile_seconds"] for e in entries.values()
        },
    }
    return data
