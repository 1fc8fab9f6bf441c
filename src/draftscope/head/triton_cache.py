"""The head's ahead-of-time Triton cache: its manifest, the checks that need no GPU, and how an engine uses it.

`python -m draftscope head-aot` (`triton_aot`) compiles the head's kernels into a Triton cache folder at the vllm
image's build (`IMAGE_CACHE`) and writes `MANIFEST` there: one entry per compiled kernel instance — kernel, CUDA
capability, the specialization Triton keyed it on (argument types, constexprs, divisibility attributes), the cache
key (Triton's hash, and the folder named after it) and the cubin's SHA-256. Everything here reads files only: no
torch, no triton (the host side and the plugin's registration import it).

How Triton finds an entry (3.8 and 3.9 alike, `triton/compiler/compiler.py::compile`): the JIT hashes the triton
install, the kernel's source, the specialization, the target (capability, ptxas version), the options and the
cache-invalidating environment variables that are set; the folder `TRITON_CACHE_DIR/<base32 of the hash>` holds the
IR, the cubin and `<kernel>.json` (the metadata), and `__grp__<kernel>.json` lists those files by absolute path. A
hit reads them and writes nothing; the list must name files that exist, or the entry counts as missing.

Why a writable overlay rather than `TRITON_CACHE_DIR` = the image's folder: a hit writes nothing, but every miss in
the process writes into `TRITON_CACHE_DIR` — torch inductor's kernels (it keeps a `TRITON_CACHE_DIR` already set),
Triton's own `cuda_utils` module (built with gcc at the first GPU use, linked against the driver's libcuda, so not at
the build), a shape the build did not foresee. The image's folder belongs to root and the kit runs images with a
read-only root filesystem, so any of those would fail the engine. `use_image_cache` instead copies the image's
entries into the writable cache (the kit's containers set `TRITON_CACHE_DIR` on their /tmp tmpfs), rewriting each
entry's file list to the copies, before the first kernel is compiled: a few MB, once per process, never over an
entry already there.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.reading import read_json

IMAGE_CACHE = "/opt/draftscope/triton-cache"  # where the vllm image keeps the compiled kernels (read-only)
MANIFEST = "draftscope-head-aot.json"
KIND = "draftscope.head_triton_aot"
SCHEMA_VERSION = 1
# Another folder than IMAGE_CACHE (tests, a cache built elsewhere); "0" turns the seeding off.
ENV_AOT_CACHE = settings.DRAFTSCOPE_TRITON_AOT_CACHE.name
ENTRY_KEYS = (
    "kernel",
    "arch",
    "target",
    "specialization",
    "cache_key",
    "key_dir",
    "cubin_sha256",
    "shared",
    "num_warps",
    "num_stages",
)
_PTX_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+[a-z]?)", re.M)


def key_dir(cache_key: str) -> str:
    """The folder name Triton's FileCacheManager gives the hash `cache_key` (hex): base32, unpadded."""
    return base64.b32encode(bytes.fromhex(cache_key)).decode("ascii").rstrip("=")


def cubin_sm(data: bytes) -> int | None:
    """The SM a cubin is for, from its ELF header (None: not a CUDA ELF). CUDA ELF ABI 7 (ptxas ≤ 12.x, up to
    sm_8x here) keeps it in the low byte of `e_flags` (sm_80: 0x500550); ABI 8 (the ptxas Triton uses for sm_90a)
    in the second byte (sm_90a: 0xa005a04)."""
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only
        return None
    if struct.unpack_from("<H", data, 18)[0] != 190:  # EM_CUDA
        return None
    flags = struct.unpack_from("<I", data, 48)[0]
    return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


def ptx_target(text: str) -> str | None:
    """The `.target` of a PTX text (`sm_80`, `sm_90a`)."""
    found = _PTX_TARGET.search(text)
    return found.group(1) if found else None


def expected_target(arch: int) -> str:
    """The PTX target Triton compiles capability `arch` for: arch-specific (`a`) from sm_90 on."""
    return f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"


# --- the manifest -------------------------------------------------------------------------------------------


def manifest(
    entries: Iterable[dict[str, Any]],
    *,
    triton_version: str,
    cuda_arch: str,
    geometries: list[dict[str, Any]],
    env: dict[str, str],
    replay: dict[str, Any],
) -> dict[str, Any]:
    """The manifest of a cache: entries (their `ENTRY_KEYS`) sorted by (arch, kernel, key); `env` the
    cache-invalidating variables set at the build (part of every key: the engine must run with the same), `replay`
    the cache-hit check's counts."""
    # No times in the file: the same build gives the same bytes (the image's layer stays reproducible).
    rows = sorted(
        ({k: e[k] for k in ENTRY_KEYS} for e in entries),
        key=lambda e: (e["arch"], e["kernel"], e["cache_key"]),
    )
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "triton_version": triton_version,
        "cuda_arch": cuda_arch,
        "archs": sorted({e["arch"] for e in rows}),
        "geometries": geometries,
        "env": dict(sorted(env.items())),
        "entries": rows,
        "replay": replay,
    }


def manifest_problems(data: Any) -> list[str]:
    """What is wrong with a manifest's shape (an empty list when nothing is)."""
    if not isinstance(data, dict):
        return ["the manifest is not a JSON object"]
    problems = []
    if data.get("kind") != KIND:
        problems.append(f"kind is {data.get('kind')!r}, not {KIND!r}")
    if data.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version is {data.get('schema_version')!r}, not {SCHEMA_VERSION}")
    entries = data.get("entries")
    if not isinstance(entries, list) or not entries:
        return [*problems, "no entries"]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"entries[{i}] is not an object")
            continue
        missing = [k for k in ENTRY_KEYS if k not in entry]
        if missing:
            problems.append(f"entries[{i}] lacks {', '.join(missing)}")
        elif (
            not re.fullmatch(r"[0-9a-f]{64}", str(entry["cache_key"]))
            or key_dir(entry["cache_key"]) != entry["key_dir"]
        ):
            problems.append(
                f"entries[{i}] ({entry['kernel']}, {entry['arch']}): cache_key and key_dir disagree"
            )
    return problems


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the cache in `folder`, checked for shape (a UserError naming the problem otherwise)."""
    path = Path(folder) / MANIFEST
    try:  # the kit's reading boundary: a pulled image's folder is data (a regular file, bounded, valid JSON)
        data = read_json(path, expect=dict)
    except UserError as exc:
        raise UserError(
            f"cannot read the head's AOT manifest: {exc.message}",
            field="cache",
            value=str(path),
            fix="build it with `python -m draftscope head-aot --cuda-arch ... --cache-dir <folder>`",
        ) from None
    problems = manifest_problems(data)
    if problems:
        raise UserError(f"bad head AOT manifest: {problems[0]}", field="cache", value=str(path))
    return data


def write_manifest(folder: Path, data: dict[str, Any]) -> Path:
    problems = manifest_problems(data)
    if problems:
        raise ValueError(f"refusing to write a bad manifest: {problems}")
    path = Path(folder) / MANIFEST
    atomic_write_json(path, data)
    return path


# --- what can be checked without a GPU ----------------------------------------------------------------------


def entry_problems(folder: Path, entry: dict[str, Any]) -> list[str]:
    """One entry against the files: Triton's group file lists existing files inside `folder`; the metadata names the
    kernel, the capability and the hash; the cubin has the recorded SHA-256 and is an ELF for that SM; the PTX
    targets `sm_XX` (`sm_XXa` from 90 on)."""
    folder = Path(folder)
    where = f"{entry['kernel']} sm_{entry['arch']} ({entry['key_dir'][:12]}…)"
    group_path = folder / entry["key_dir"] / f"__grp__{entry['kernel']}.json"
    try:
        children = json.loads(group_path.read_text(encoding="utf-8"))["child_paths"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{where}: Triton's group file is unreadable: {exc}"]
    files = {}
    for name, path in children.items():
        path = Path(path)
        if path.parent != folder / entry["key_dir"] or not path.is_file():
            return [f"{where}: the group file names {path}, not a file of this entry's folder"]
        files[name.rsplit(".", 1)[-1]] = path
    problems = []
    try:
        meta = json.loads(files["json"].read_text(encoding="utf-8"))
        cubin = files["cubin"].read_bytes()
        ptx = files["ptx"].read_text(encoding="utf-8")
    except (KeyError, OSError, ValueError) as exc:
        return [f"{where}: metadata, cubin or PTX missing or unreadable: {exc}"]
    target = meta.get("target") or {}
    if (target.get("backend"), target.get("arch")) != ("cuda", entry["arch"]):
        problems.append(f"{where}: the metadata's target is {target}")
    if meta.get("name") != entry["kernel"] or meta.get("hash") != entry["cache_key"]:
        problems.append(f"{where}: the metadata names {meta.get('name')} / {meta.get('hash')}")
    if hashlib.sha256(cubin).hexdigest() != entry["cubin_sha256"]:
        problems.append(f"{where}: the cubin's SHA-256 differs from the manifest's")
    sm = cubin_sm(cubin)
    if sm != entry["arch"]:
        problems.append(f"{where}: the cubin is an ELF for sm {sm}, not {entry['arch']}")
    if ptx_target(ptx) != expected_target(entry["arch"]) or entry["target"] != expected_target(entry["arch"]):
        problems.append(f"{where}: the PTX targets {ptx_target(ptx)}, not {expected_target(entry['arch'])}")
    return problems


def cache_problems(folder: Path, data: dict[str, Any]) -> list[str]:
    """Every entry of a manifest checked against the files in `folder`."""
    return [p for entry in data["entries"] for p in entry_problems(folder, entry)]


# --- at run time: the engine's processes ----------------------------------------------------------------------


def default_cache_dir(environ: Mapping[str, str] | None = None) -> str:
    """Triton's own default when TRITON_CACHE_DIR is unset (`knobs.cache.dir`): $TRITON_HOME or ~, /.triton/cache."""
    home = settings.TRITON_HOME.raw(environ) or settings.HOME.raw(environ) or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def seed(image: Path, cache: Path) -> list[str]:
    """Copy the manifest's entries from `image` into `cache` where `cache` lacks them; returns the folders copied.

    Each entry goes to a private temporary folder, its group file rewritten to name the copies, then is renamed into
    place: engine processes seeding at once never see half an entry, and the one that loses the race drops its copy.
    An entry already in `cache` (seeded before, or compiled there by Triton itself) stays as it is."""
    image, cache = Path(image), Path(cache)
    data = read_manifest(image)
    cache.mkdir(parents=True, exist_ok=True)
    copied = []
    for key in sorted({e["key_dir"] for e in data["entries"]}):
        dest = cache / key
        if dest.exists():
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".draftscope-seed-{key[:12]}-", dir=cache))
        try:
            for src in (image / key).iterdir():
                if src.name.startswith("__grp__"):
                    group = json.loads(src.read_text(encoding="utf-8"))
                    group["child_paths"] = {
                        name: str(dest / Path(path).name) for name, path in group["child_paths"].items()
                    }
                    (tmp / src.name).write_text(json.dumps(group), encoding="utf-8")
                else:
                    shutil.copyfile(src, tmp / src.name)
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the entry from another uid sharing the cache
            os.rename(tmp, dest)
        except OSError:
            if not dest.exists():
                raise
            continue  # another process put the entry there first
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        copied.append(key)
    return copied


def use_image_cache(environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """Make the image's compiled kernels hits for this process: seed the writable Triton cache (TRITON_CACHE_DIR,
    else Triton's default, which is then set explicitly) from the image's folder. Call it before the first Triton
    compile of the process. `environ` is this process's environment when None. Never raises: the facts (what was
    seeded, or why not) go to the plugin's status."""
    image = settings.DRAFTSCOPE_TRITON_AOT_CACHE.get(environ) or IMAGE_CACHE
    if image == "0":
        return {"state": "off", "reason": f"{ENV_AOT_CACHE}=0"}
    if not (Path(image) / MANIFEST).is_file():
        return {"state": "absent", "image_cache": image}
    cache = settings.TRITON_CACHE_DIR.get(environ) or default_cache_dir(environ)
    facts: dict[str, Any] = {"image_cache": image, "triton_cache_dir": cache}
    try:
        if Path(cache).resolve() == Path(image).resolve():
            # The image's own folder: hits work, but any miss would write into it (see the module docstring).
            return {
                **facts,
                "state": "in-place",
                "reason": "TRITON_CACHE_DIR is the image's read-only folder",
            }
        settings.TRITON_CACHE_DIR.set(cache, environ)
        data = read_manifest(Path(image))
        copied = seed(Path(image), Path(cache))
    except (OSError, UserError, ValueError, KeyError) as exc:
        return {**facts, "state": "not-seeded", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
    # Keys include the cache-invalidating variables that are set: another value here means no entry can hit.
    names = {*data["env"], *(n for n in settings.TRITON_FAMILY.names(environ) if n not in _NOT_IN_KEY)}
    here = settings.named(names, environ)
    differ = sorted(name for name in names if here.get(name) != data["env"].get(name))
    return {
        **facts,
        "state": "seeded" if not differ else "seeded-env-differs",
        "entries": len(data["entries"]),
        "copied": len(copied),
        "archs": data["archs"],
        "triton_version": data["triton_version"],
        "env_differs": differ,
    }


# TRITON_* variables that never enter a kernel's cache key (where the cache is, how the process runs). Any other set
# TRITON_* variable is reported when the build did not have it: `triton._C.libtriton.get_cache_invalidating_env_vars`
# knows the exact list, but this runs before triton is imported.
_NOT_IN_KEY = frozenset(
    {
        "TRITON_CACHE_DIR",
        "TRITON_HOME",
        "TRITON_CACHE_MANAGER",
        "TRITON_DUMP_DIR",
        "TRITON_OVERRIDE_DIR",
        "TRITON_PTXAS_PATH",
        "TRITON_PRINT_AUTOTUNING",
        "TRITON_LIBCUDA_PATH",
        "TRITON_INTERPRET",
    }
)
