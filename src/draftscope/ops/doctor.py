"""The host report behind `invoke doctor`: GPUs, container engine, toolkit, images, memory and disk.

It answers "can this machine run the kit, and how?" without importing torch or touching CUDA. GPU facts come
from NVML (nvidia-ml-py, imported lazily) with `nvidia-smi --query-gpu` as the fallback. Every probe that
reads the host (subprocesses, PATH, files) is injectable through `Probes`, so tests need no GPU and no engine;
a missing binary, a timeout or a missing file is an ordinary "not found" answer, never a crash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.ops.images import IMAGES, image_reference

Runner = Callable[..., subprocess.CompletedProcess]

SMI_FIELDS = "index,name,uuid,compute_cap,memory.total,memory.free,driver_version,clocks.max.sm"
SMI_QUERY = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
ENGINE_TIMEOUT_S = 5.0
# nvidia-smi can take several seconds to initialise the driver on a cold machine.
SMI_TIMEOUT_S = 15.0
_MISSING = {"[N/A]", "[Not Supported]", "N/A", ""}
# The lowest Linux driver branch of each CUDA major release; minor-version compatibility covers the rest of the
# major (NVIDIA's CUDA compatibility guide: CUDA 12.x needs >= 525.60.13, CUDA 13.x >= 580.65.06).
MIN_DRIVER_BRANCH = {12: 525, 13: 580}
_CDI = (".yaml", ".yml", ".json")


def dtype_for_capability(major: int, minor: int) -> str:
    """bfloat16 from Ampere (compute capability 8.0) on, where it is native; float16 before."""
    return "bfloat16" if (major, minor) >= (8, 0) else "float16"


@dataclass(frozen=True)
class Gpu:
    """One NVIDIA GPU as the run manifest records it. `cuda_version` is the driver's highest CUDA."""

    index: int
    name: str
    uuid: str | None
    compute_capability: tuple[int, int] | None
    memory_total_mib: int | None
    memory_free_mib: int | None
    driver_version: str | None
    cuda_version: str | None = None
    clocks_sm_max_mhz: int | None = None

    @property
    def dtype(self) -> str | None:
        """The dtype the kit runs models in on this GPU; None when the capability is unknown."""
        return dtype_for_capability(*self.compute_capability) if self.compute_capability else None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        out["dtype"] = self.dtype
        return out


def _smi_error(lineno: int, line: str, why: str) -> UserError:
    return UserError(
        f"line {lineno}: {why}",
        source="nvidia-smi",
        value=line,
        fix=f"pass the output of `{' '.join(SMI_QUERY)}`",
    )


def _opt(text: str) -> str | None:
    return None if text in _MISSING else text


def _int(text: str) -> int | None:
    return None if text in _MISSING else int(text)


def _capability(text: str) -> tuple[int, int] | None:
    if text in _MISSING:
        return None
    major, minor = text.split(".")  # "8.0"; anything else is a ValueError
    return int(major), int(minor)


def parse_nvidia_smi(csv_text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits` output, one GPU a line."""
    gpus = []
    for lineno, line in enumerate(csv_text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 8:
            raise _smi_error(lineno, line, f"expected 8 fields ({SMI_FIELDS}), got {len(fields)}")
        index, name, uuid, cap, total, free, driver, clock = fields
        try:
            gpus.append(
                Gpu(
                    int(index),
                    name,
                    _opt(uuid),
                    _capability(cap),
                    _int(total),
                    _int(free),
                    _opt(driver),
                    cuda_version=None,
                    clocks_sm_max_mhz=_int(clock),
                )
            )
        except ValueError:
            raise _smi_error(lineno, line, "a number or a capability (like 8.0) did not parse") from None
    return gpus


def parse_cuda_version(nvidia_smi_text: str) -> str | None:
    """The driver's highest CUDA version from plain `nvidia-smi` header text ("CUDA Version: 12.4")."""
    match = re.search(r"CUDA Version:\s*(\d+\.\d+)", nvidia_smi_text)
    return match.group(1) if match else None


def _text(value: str | bytes) -> str:
    # Old nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def gpus_from_nvml(nvml: Any | None = None) -> list[Gpu] | None:
    """Read GPUs through NVML; None when nvidia-ml-py or the driver library is unavailable."""
    if nvml is None:
        try:
            import pynvml as nvml  # lazy: the driver library is looked up on nvmlInit, not on import
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = nvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for 12.4
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    compute_capability=tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
                    memory_total_mib=memory.total // 2**20,
                    memory_free_mib=memory.free // 2**20,
                    driver_version=driver,
                    cuda_version=cuda_version,
                    clocks_sm_max_mhz=nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
                )
            )
        return gpus
    except nvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _run(
    runner: Runner, argv: list[str], timeout: float = ENGINE_TIMEOUT_S
) -> subprocess.CompletedProcess | None:
    """Run argv; None when the binary is missing or does not answer in time."""
    try:
        return runner(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):  # not installed, not executable, or hanging
        return None


def gpus_from_nvidia_smi(runner: Runner = subprocess.run) -> list[Gpu] | None:
    """Read GPUs through `nvidia-smi`; None when it is missing, hangs or fails (no usable driver)."""
    done = _run(runner, SMI_QUERY, SMI_TIMEOUT_S)
    if done is None or done.returncode != 0:
        return None
    gpus = parse_nvidia_smi(done.stdout)
    plain = _run(runner, ["nvidia-smi"], SMI_TIMEOUT_S)
    cuda = parse_cuda_version(plain.stdout) if plain is not None and plain.returncode == 0 else None
    return [dataclasses.replace(gpu, cuda_version=cuda) for gpu in gpus]


def nvidia_gpus_present() -> bool:
    """Whether this host has an NVIDIA GPU a run can use: NVML, else nvidia-smi (what a GPU step is refused on)."""
    try:
        found = gpus_from_nvml()
    except Exception:  # a broken NVML install: ask nvidia-smi
        found = None
    return bool(found or gpus_from_nvidia_smi())


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


@dataclass(frozen=True)
class Probes:
    """Everything `collect` reads from the host; tests replace these with fakes."""

    run: Runner = subprocess.run
    which: Callable[[str], str | None] = shutil.which
    exists: Callable[[str], bool] = os.path.exists
    glob: Callable[[str], list[str]] = glob.glob
    read_text: Callable[[str], str | None] = _read_text
    system: Callable[[], tuple[str, str]] = lambda: (sys.platform, platform.machine())
    disk_usage: Callable[[str], Any] = shutil.disk_usage
    nvml: Any = None  # a pynvml-like module; None imports the real one
    cwd: str = "."


def unsupported_accelerators(probes: Probes) -> list[dict[str, str]]:
    """Non-NVIDIA accelerators, from cheap filesystem/PATH evidence: reported, never used."""
    found = []
    # PCI vendor ids of render nodes: 0x1002 AMD, 0x8086 Intel (NVIDIA's 0x10de is the supported case).
    drm = probes.glob("/sys/class/drm/renderD*/device/vendor")
    vendors = {(probes.read_text(p) or "").strip() for p in drm}
    amd = ["/dev/kfd"] if probes.exists("/dev/kfd") else []
    amd += [tool for tool in ("rocm-smi", "amd-smi") if probes.which(tool)]
    if amd or "0x1002" in vendors:
        found.append({"vendor": "AMD", "stack": "ROCm", "evidence": ", ".join(amd) or "DRM vendor 0x1002"})
    intel = [tool for tool in ("xpu-smi", "sycl-ls") if probes.which(tool)]
    if intel or "0x8086" in vendors:
        found.append({"vendor": "Intel", "stack": "XPU", "evidence": ", ".join(intel) or "DRM vendor 0x8086"})
    if probes.system() == ("darwin", "arm64"):
        found.append({"vendor": "Apple", "stack": "MPS", "evidence": "macOS on arm64"})
    return found


def _engine(probes: Probes, name: str) -> dict[str, Any]:
    """Whether `name` is on PATH and its engine answers; docker prints a null Server when it does not."""
    info: dict[str, Any] = dict(name=name, path=probes.which(name), answers=False, version=None, error=None)
    if info["path"] is None:
        return info
    fmt = "{{json .}}" if name == "docker" else "json"
    done = _run(probes.run, [name, "version", "--format", fmt])
    if done is None:
        info["error"] = f"no answer within {ENGINE_TIMEOUT_S:g} s"
        return info
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = {}
    server = (data.get("Server") or data.get("Client")) if name == "podman" else data.get("Server")
    info["answers"] = done.returncode == 0 and bool(server)
    info["version"] = (server or {}).get("Version")
    if not info["answers"]:
        info["error"] = (done.stderr.strip().splitlines() or ["engine not answering"])[-1]
    return info


def _toolkit(probes: Probes) -> dict[str, Any]:
    """NVIDIA Container Toolkit pieces: the CLI, the runtime and any CDI specs generated by it."""
    done = _run(probes.run, ["nvidia-ctk", "--version"])
    first = done.stdout.strip().splitlines()[:1] if done and done.returncode == 0 else []
    specs = sorted(p for d in ("/etc/cdi", "/var/run/cdi") for p in probes.glob(f"{d}/*") if p.endswith(_CDI))
    return {
        "nvidia_ctk": first[0] if first else None,
        "runtime": probes.which("nvidia-container-runtime"),
        "cdi_specs": specs,
    }


def _images(probes: Probes, engine: str) -> dict[str, Any]:
    """Each kit image in this engine's local store: its Id and RepoDigests, or absent."""
    out = {}
    for name in IMAGES:
        ref = image_reference(name)
        done = _run(probes.run, [engine, "image", "inspect", ref])
        entry: dict[str, Any] = {"reference": ref, "present": False, "id": None, "repo_digests": []}
        if done is not None and done.returncode == 0:
            with contextlib.suppress(ValueError, LookupError, AttributeError):  # not the JSON we expect
                data = json.loads(done.stdout)[0]
                entry.update(present=True, id=data.get("Id"), repo_digests=data.get("RepoDigests") or [])
        out[name] = entry
    return out


def _memory(probes: Probes) -> dict[str, int] | None:
    text = probes.read_text("/proc/meminfo")
    if text is None:
        return None
    kib = {key: int(value) for key, value in re.findall(r"^(\w+):\s+(\d+)", text, re.MULTILINE)}
    if "MemTotal" not in kib:
        return None
    # MemAvailable (Linux >= 3.14) counts reclaimable cache; MemFree is the older, pessimistic figure.
    available = kib.get("MemAvailable", kib.get("MemFree", 0))
    return {"total_mib": kib["MemTotal"] // 1024, "available_mib": available // 1024}


def _disk(probes: Probes) -> dict[str, Any]:
    usage = probes.disk_usage(probes.cwd)
    return {
        "path": os.path.abspath(probes.cwd),
        "free_gib": round(usage.free / 2**30, 1),
        "total_gib": round(usage.total / 2**30, 1),
    }


def _verdict(report: dict[str, Any]) -> list[str]:
    """What the findings mean for running the kit here, most important first."""
    gpus, lines = report["gpus"], []
    if gpus:
        dtypes = "/".join(sorted({g["dtype"] or "unknown" for g in gpus}))
        lines.append(f"{len(gpus)} NVIDIA GPU(s) via {report['gpu_source']}; models run in {dtypes}")
    else:
        lines.append(
            "no NVIDIA GPU found: GPU steps cannot run here; CPU runs (`--runtime local`) still work"
        )
    lines += [
        f"{a['vendor']} {a['stack']} found ({a['evidence']}): not supported, the kit targets NVIDIA CUDA"
        for a in report["unsupported_accelerators"]
    ]
    answering = [e["name"] for e in report["engines"] if e["answers"]]
    if not answering:
        lines.append("no container engine answers: start docker or podman, or use `--runtime local`")
    if gpus and answering and not (report["toolkit"]["nvidia_ctk"] or report["toolkit"]["runtime"]):
        lines.append("NVIDIA Container Toolkit not found: containers will not see the GPUs; install it")
    for engine, images in report["images"].items():
        missing = [name for name, entry in images.items() if not entry["present"]]
        if missing:
            lines.append(f"{engine}: images not built: {', '.join(missing)}; run `make images`")
    lines += driver_problems(gpus, report.get("image_cuda", {}))
    lines += [
        f"not pinned: {line} (run `invoke images.lock` where registries are reachable)"
        for line in report.get("unpinned", [])
    ]
    return lines


def _version_tuple(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def image_cuda() -> dict[str, str]:
    """The CUDA version each image is built on (images/images.lock.json `versions.cuda`); empty outside a checkout,
    where the lock is not installed."""
    from draftscope.ops.images import load_lock

    try:
        lock = load_lock()
    except UserError:
        return {}
    return {name: e["versions"]["cuda"] for name, e in lock["images"].items() if e["versions"].get("cuda")}


def driver_problems(gpus: list[dict[str, Any]], images: dict[str, str]) -> list[str]:
    """A driver too old for an image's CUDA, with the fix: one line per CUDA version the driver does not reach.

    The driver's highest CUDA (NVML, or the `nvidia-smi` header) must reach each image's major.minor. Below the
    image's major the image's GPU steps fail to start; within it, minor-version compatibility runs them with
    limits (no PTX JIT of newer code), so that is a warning.
    """
    have = next((_version_tuple(g.get("cuda_version")) for g in gpus if g.get("cuda_version")), None)
    if have is None:
        return []
    driver = next((g.get("driver_version") for g in gpus if g.get("driver_version")), None) or "unknown"
    by_cuda: dict[tuple[int, int], list[str]] = {}
    for name, version in images.items():
        need = _version_tuple(version)
        if need is not None and have < need:
            by_cuda.setdefault(need, []).append(name)
    lines = []
    for (major, minor), names in sorted(by_cuda.items()):
        cuda = f"{major}.{minor}"
        branch = MIN_DRIVER_BRANCH.get(major)
        newer = f"an NVIDIA driver of the {branch} branch or newer" if branch else f"a driver for CUDA {cuda}"
        which = f"image(s) {', '.join(names)}"
        if have[0] < major:
            lines.append(
                f"driver {driver} supports CUDA up to {have[0]}.{have[1]}, too old for the CUDA {cuda} of {which}:"
                f" their GPU steps fail to start; fix: install {newer}, or, on a data-center GPU, NVIDIA's CUDA"
                f" forward-compatibility package cuda-compat-{major}-{minor}"
            )
        else:
            lines.append(
                f"driver {driver} supports CUDA up to {have[0]}.{have[1]}, below the CUDA {cuda} of {which}: they run"
                f" through minor-version compatibility, with its limits; fix: install {newer} for full support"
            )
    return lines


def _unpinned() -> list[str]:
    """What images/images.lock.json leaves unpinned: a base without a digest is flagged, never hidden."""
    from draftscope.ops.images import load_lock, unpinned

    try:
        return unpinned(load_lock())
    except UserError as exc:
        return [f"images.lock.json unreadable: {exc.render()}"]


def collect(probes: Probes | None = None) -> dict[str, Any]:
    """The JSON-serialisable host report; probes default to the real host."""
    probes = probes or Probes()
    gpus, source = gpus_from_nvml(probes.nvml), "nvml"
    if gpus is None:
        gpus, source = gpus_from_nvidia_smi(probes.run), "nvidia-smi"
    engines = [_engine(probes, name) for name in ("docker", "podman")]
    report: dict[str, Any] = {
        "gpus": [gpu.as_dict() for gpu in gpus or []],
        "gpu_source": source if gpus is not None else None,
        "unsupported_accelerators": unsupported_accelerators(probes),
        "engines": engines,
        "toolkit": _toolkit(probes),
        "images": {e["name"]: _images(probes, e["name"]) for e in engines if e["answers"]},
        "memory": _memory(probes),
        "disk": _disk(probes),
        "unpinned": _unpinned(),
        "image_cuda": image_cuda(),
    }
    report["verdict"] = _verdict(report)
    return report


def render(report: dict[str, Any]) -> list[str]:
    """Human-readable lines for a `collect` report."""
    lines = [f"GPUs ({report['gpu_source']}):" if report["gpus"] else "GPUs: no NVIDIA GPU found"]
    for g in report["gpus"]:
        cap = ".".join(map(str, g["compute_capability"] or ["?"]))
        lines.append(
            f"  {g['index']}: {g['name']}, compute {cap}, {g['dtype']}, {g['memory_free_mib']} MiB free of"
            f" {g['memory_total_mib']}, driver {g['driver_version']}, CUDA {g['cuda_version']},"
            f" SM max {g['clocks_sm_max_mhz']} MHz"
        )
    lines += [
        f"unsupported: {a['vendor']} {a['stack']} ({a['evidence']})"
        for a in report["unsupported_accelerators"]
    ]
    for e in report["engines"]:
        state = f"answers, version {e['version']}" if e["answers"] else f"not answering ({e['error']})"
        lines.append(f"{e['name']}: {state if e['path'] else 'not on PATH'}")
    kit = report["toolkit"]
    lines.append(
        f"NVIDIA Container Toolkit: nvidia-ctk {kit['nvidia_ctk'] or 'not found'},"
        f" runtime {kit['runtime'] or 'not found'}, CDI specs {', '.join(kit['cdi_specs']) or 'none'}"
    )
    for engine, images in report["images"].items():
        lines += [
            f"{engine} {e['reference']}: {e['id'] if e['present'] else 'missing'}" for e in images.values()
        ]
    if mem := report["memory"]:
        lines.append(f"memory: {mem['available_mib']} MiB available of {mem['total_mib']} MiB")
    disk = report["disk"]
    lines.append(f"disk: {disk['free_gib']} GiB free of {disk['total_gib']} GiB at {disk['path']}")
    if report.get("image_cuda"):
        lines.append("images' CUDA: " + ", ".join(f"{n} {v}" for n, v in report["image_cuda"].items()))
    lines.append("verdict:")
    lines.extend(f"  - {line}" for line in report["verdict"])
    return lines
