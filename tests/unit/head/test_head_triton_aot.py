"""`head-aot` for real: the head's kernels compiled for sm_80 and sm_90a into a Triton cache, without a GPU, and the
proof that the engine's JIT would load them instead of compiling.

One build (a Qwen3-8B head, 151936 × 4096 bf16, rows up to 16: the three specializations of the row count) feeds
every test. The cache-hit proof does not reuse the build's own replay: a fresh process, with the stand-in driver for
the capability, enters Triton by `JITFunction.warmup` — the other public way into `JITFunction.run` — with
compiling and cache writes made to fail; the same call with one argument specialized otherwise (M = 64, divisible
by 16) or one cache-invalidating variable set (TRITON_DEFAULT_FP_FUSION=0) must miss, so the check is not vacuous.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from draftscope.head import triton_aot, triton_cache  # noqa: E402

pytestmark = pytest.mark.slow

GEOMETRY = triton_aot.Geometry(151936, 4096, max_rows=16, source="qwen3-8b, rows ≤ 16")
KERNELS = {"coarse_kernel", "topk_keys_kernel", "topk_merge_kernel", "refine_kernel"}

WARMUP_CHILD = """
import json, os, sys, torch, triton
from pathlib import Path
from draftscope.head import triton_aot, triton_kernels as tk
arch, cache, m = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
os.environ["TRITON_CACHE_DIR"] = cache
before = sorted(str(p) for p in Path(cache).rglob("*"))
driver = triton_aot.StandInDriver(arch)
triton.runtime.driver.set_active(driver)
triton_aot._forbid_compiling()
try:
    # refine_triton's launch: w, h bf16; ids int64; f fp32; a fp64; M = K + 3 = 67 candidates; D; a_pad
    kernel = tk.kernels()["refine"].warmup(
        torch.bfloat16, torch.bfloat16, torch.int64, torch.float32, torch.float64, m, 4096, 1.0,
        BLOCK_M=tk.REFINE_BLOCK_M, BLOCK_D=tk.REFINE_BLOCK_D, grid=(1,),
    )
    result = {"hit": kernel.hash, "launched": driver.launches}
except triton_aot.CacheMiss as exc:
    result = {"miss": str(exc)}
result["unchanged"] = before == sorted(str(p) for p in Path(cache).rglob("*"))
print(json.dumps(result))
"""


def _env(**extra: str) -> dict[str, str]:
    drop = ("TRITON_INTERPRET", "TRITON_CACHE_DIR", "TRITON_DEFAULT_FP_FUSION", triton_cache.ENV_AOT_CACHE)
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(cache folder, manifest) of one build for sm_80 and sm_90."""
    cache = tmp_path_factory.mktemp("aot") / "triton-cache"
    saved = {
        k: os.environ.pop(k) for k in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION") if k in os.environ
    }
    try:
        data = triton_aot.build([80, 90], "8.0;9.0", cache, [GEOMETRY], jobs=2)
    finally:
        os.environ.update(saved)
    return cache, data


def test_every_kernel_the_plugin_launches_is_compiled_for_each_arch(built):
    cache, data = built
    assert data["archs"] == [80, 90]
    for arch, target in ((80, "sm_80"), (90, "sm_90a")):
        entries = [e for e in data["entries"] if e["arch"] == arch]
        assert {e["kernel"] for e in entries} == KERNELS
        assert {e["target"] for e in entries} == {target}
        # the row count N: == 1 (a constexpr), not a multiple of 16, a multiple of 16
        assert sum(e["kernel"] == "coarse_kernel" for e in entries) == 3
        # the merge tree over 149 blocks of keys: 19 and 3 blocks (one specialization), then 1 (a constexpr)
        assert sum(e["kernel"] == "topk_merge_kernel" for e in entries) == 2
        assert data["replay"][str(arch)]["hits"] == len(entries)
    assert triton_cache.cache_problems(cache, data) == []
    assert triton_cache.read_manifest(cache) == {k: v for k, v in data.items() if k != "seconds"}
    assert set(data["seconds"]["compile"]) == {"80", "90"} and len(data["seconds"]["entries"]) == len(
        data["entries"]
    )


def test_the_cubins_are_elf_for_their_sm(built):
    cache, data = built
    for e in data["entries"]:
        cubin = (cache / e["key_dir"] / f"{e['kernel']}.cubin").read_bytes()
        assert triton_cache.cubin_sm(cubin) == e["arch"], e["kernel"]
        meta = json.loads((cache / e["key_dir"] / f"{e['kernel']}.json").read_text())
        assert meta["target"] == {"backend": "cuda", "arch": e["arch"], "warp_size": 32}


def test_the_specializations_are_the_launches(built):
    _, data = built
    entries = [e for e in data["entries"] if e["arch"] == 90]
    coarse = [e["specialization"] for e in entries if e["kernel"] == "coarse_kernel"]
    div16 = [["tt.divisibility", 16]]
    for spec in coarse:
        # every pointer is 16-byte aligned (the caching allocator's blocks), V and D are multiples of 16, G == 1
        assert all(spec["attrs"][name] == div16 for name in spec["signature"] if name.endswith("_ptr"))
        assert spec["attrs"]["V"] == spec["attrs"]["D"] == div16 and spec["constexprs"]["G"] == 1
        assert spec["signature"]["h_ptr"] == "*bf16" and spec["constexprs"]["DOT_BF16"] is True
    rows = sorted(
        ("one" if s["constexprs"].get("N") == 1 else "16n" if s["attrs"].get("N") == div16 else "other")
        for s in coarse
    )
    assert rows == ["16n", "one", "other"]
    (refine,) = [e["specialization"] for e in entries if e["kernel"] == "refine_kernel"]
    assert (
        "M" not in refine["attrs"] and refine["signature"]["M"] == "i32"
    )  # 67 candidates: K + 2 + the draft
    keys = [e["specialization"] for e in entries if e["kernel"] == "topk_keys_kernel"]
    assert keys[0]["constexprs"] == {"BLOCK": 1024, "KP": 128}


def _warmup(arch: int, cache, m: int = 67, **env: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WARMUP_CHILD, str(arch), str(cache), str(m)],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [80, 90])
def test_a_fresh_jit_finds_the_entry_instead_of_compiling(built, arch):
    cache, data = built
    got = _warmup(arch, cache)
    (refine,) = [e for e in data["entries"] if e["arch"] == arch and e["kernel"] == "refine_kernel"]
    assert got == {"hit": refine["cache_key"], "launched": 0, "unchanged": True}


@pytest.mark.parametrize(
    ("m", "env"), [(64, {}), (67, {"TRITON_DEFAULT_FP_FUSION": "0"})], ids=["M-divisible-by-16", "env-var"]
)
def test_another_specialization_or_environment_misses(built, m, env):
    cache, _ = built
    got = _warmup(90, cache, m, **env)
    # (a miss has already made the new entry's empty folder: Triton's cache manager makes it on creation, which a
    # read-only TRITON_CACHE_DIR would refuse — one reason the engine seeds a writable overlay instead)
    assert "is not in the cache" in got["miss"]


def test_the_engines_seeded_overlay_hits_every_launch(built, tmp_path):
    """The engine's path: the image's folder seeded into a writable cache, then every launch replayed there."""
    cache, data = built
    overlay = tmp_path / "run-cache"
    assert len(triton_cache.seed(cache, overlay)) == len(data["entries"])
    code = (
        "import json, sys\nfrom draftscope.head import triton_aot\n"
        "g = triton_aot.Geometry(**json.loads(sys.argv[2]))\n"
        "r = triton_aot.run_arch(90, [g], sys.argv[1], replay=True)\n"
        "print(json.dumps({'hits': len(r['loaded']), 'unchanged': r['listing_unchanged']}))\n"
    )
    geometry = {k: v for k, v in vars(GEOMETRY).items()}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(overlay), json.dumps(geometry)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    hits = json.loads(proc.stdout.strip().splitlines()[-1])
    assert hits == {"hits": sum(e["arch"] == 90 for e in data["entries"]), "unchanged": True}
