"""GPU and accelerator facts of this host, without importing torch or touching CUDA: NVML (nvidia-ml-py,
imported lazily) with `nvidia-smi --query-gpu` as the fallback. Every probe that reads the host is injectable
(`Probes`, `runner=`), so tests need no GPU; a missing binary, a timeout or a missing file is "not found", never a
crash. `invoke doctor` (draftscope.ops.doctor) reports these facts; planners and workers use them directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
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

Runner = Callable[..., subprocess.CompletedProcess]

SMI_FIELDS = "index,name,uuid,compute_cap,memory.total,memory.free,driver_version,clocks.max.sm"
SMI_QUERY = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
ENGINE_TIMEOUT_S = 5.0
# nvidia-smi can take several seconds to initialise the driver on a cold machine.
SMI_TIMEOUT_S = 15.0
_MISSING = {"[N/A]", "[Not Supported]", "N/A", ""}


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
