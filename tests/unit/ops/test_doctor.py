"""The host report: nvidia-smi parsing, the NVML path, probes for engines and accelerators, and collect/render."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from draftscope.core import hardware
from draftscope.core.errors import UserError
from draftscope.ops import doctor
from draftscope.ops.images import IMAGES, image_reference

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- dtype and nvidia-smi parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "dtype"),
    [
        ((7, 0), "float16"),
        ((7, 5), "float16"),
        ((8, 0), "bfloat16"),
        ((8, 9), "bfloat16"),
        ((9, 0), "bfloat16"),
    ],
)
def test_dtype_for_capability(cap, dtype):
    assert hardware.dtype_for_capability(*cap) == dtype


def test_parse_a100():
    (gpu,) = hardware.parse_nvidia_smi(fixture("a100-80gb.csv"))
    assert gpu.index == 0
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-0a1b2c3d-0000-4000-8000-00000000a100"
    assert gpu.compute_capability == (8, 0)
    assert gpu.dtype == "bfloat16"
    assert (gpu.memory_total_mib, gpu.memory_free_mib) == (81920, 81037)
    assert gpu.driver_version == "550.54.15"
    assert gpu.clocks_sm_max_mhz == 1410
    assert gpu.cuda_version is None  # the CSV query does not carry it


def test_parse_h200_several():
    gpus = hardware.parse_nvidia_smi(fixture("h200.csv"))
    assert [g.index for g in gpus] == [0, 1]
    assert {g.name for g in gpus} == {"NVIDIA H200"}
    assert all(g.compute_capability == (9, 0) and g.dtype == "bfloat16" for g in gpus)
    assert [g.memory_total_mib for g in gpus] == [143771, 143771]
    assert gpus[1].memory_free_mib == 12544


def test_parse_t4_is_float16():
    (gpu,) = hardware.parse_nvidia_smi(fixture("t4.csv"))
    assert gpu.name == "Tesla T4"
    assert gpu.compute_capability == (7, 5)
    assert gpu.dtype == "float16"
    assert gpu.driver_version == "535.183.01"


def test_parse_na_fields_become_none():
    rtx, a10g = hardware.parse_nvidia_smi(fixture("na-fields.csv"))
    assert rtx.uuid is None
    assert rtx.memory_free_mib is None
    assert rtx.clocks_sm_max_mhz is None
    assert rtx.compute_capability == (8, 6)
    assert rtx.memory_total_mib == 24576
    assert a10g.compute_capability is None
    assert a10g.dtype is None
    assert a10g.memory_total_mib is None
    assert a10g.clocks_sm_max_mhz == 1710


def test_parse_empty_output_is_no_gpus():
    assert hardware.parse_nvidia_smi("\n") == []


@pytest.mark.parametrize(
    ("text", "lineno"),
    [
        ("0, NVIDIA H200, GPU-x, 9.0, 143771, 143208, 550.90.07\n", 1),  # seven fields
        (
            fixture("t4.csv")
            + "index, name, uuid, compute_cap, memory.total, memory.free, driver_version, clocks.max.sm\n",
            2,
        ),
        ("0, Tesla T4, GPU-x, 7.5, 15360 MiB, 14912 MiB, 535.183.01, 1590 MHz\n", 1),  # units not suppressed
        ("0, Tesla T4, GPU-x, 75, 15360, 14912, 535.183.01, 1590\n", 1),  # capability without a dot
    ],
)
def test_parse_malformed_names_the_line(text, lineno):
    with pytest.raises(UserError) as err:
        hardware.parse_nvidia_smi(text)
    message = str(err.value)
    assert message.startswith("nvidia-smi:")
    assert f"line {lineno}:" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "cuda"), [("h200-header.txt", "12.4"), ("a100-header.txt", "12.4"), ("t4-header.txt", "12.2")]
)
def test_parse_cuda_version(name, cuda):
    assert hardware.parse_cuda_version(fixture(name)) == cuda


def test_parse_cuda_version_absent():
    assert (
        hardware.parse_cuda_version("NVIDIA-SMI has failed because it couldn't communicate with the driver")
        is None
    )


# --- NVML, with a pynvml-shaped fake --------------------------------------------------------------------------


class FakeNVMLError(Exception):
    pass


Memory = namedtuple("Memory", "total free used")


class FakeNvml:
    """Mirrors the nvidia-ml-py calls doctor makes: same names, same return shapes (bytes for memory)."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM = 1

    def __init__(self, devices, fail_init=False):
        self.devices = devices
        self.fail_init = fail_init
        self.shutdown = 0

    def nvmlInit(self):
        if self.fail_init:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shutdown += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle["cap"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return Memory(handle["total_mib"] * 2**20, handle["free_mib"] * 2**20, 0)

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1980


H200 = {"name": "NVIDIA H200", "uuid": "GPU-abc", "cap": (9, 0), "total_mib": 143771, "free_mib": 143208}


def test_nvml_reads_gpus():
    nvml = FakeNvml([H200, {**H200, "name": b"Tesla T4", "cap": (7, 5)}])
    gpus = hardware.gpus_from_nvml(nvml)
    assert [g.name for g in gpus] == ["NVIDIA H200", "Tesla T4"]
    h200 = gpus[0]
    assert h200.compute_capability == (9, 0)
    assert h200.dtype == "bfloat16"
    assert (h200.memory_total_mib, h200.memory_free_mib) == (143771, 143208)
    assert (h200.driver_version, h200.cuda_version, h200.clocks_sm_max_mhz) == ("550.90.07", "12.4", 1980)
    assert gpus[1].dtype == "float16"
    assert nvml.shutdown == 1


def test_nvml_unavailable_is_none():
    assert hardware.gpus_from_nvml(FakeNvml([H200], fail_init=True)) is None


def test_real_nvml_matches_the_fake_shape():
    pynvml = pytest.importorskip("pynvml")
    for name in [n for n in dir(FakeNvml) if n.startswith(("nvml", "NVML"))]:
        assert hasattr(pynvml, name), name


# --- nvidia-smi through a runner -------------------------------------------------------------------------------


def fake_runner(answers):
    """A subprocess.run stand-in: answers maps argv[0:2] (or argv[0]) to (rc, stdout, stderr) or an exception."""
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        assert kwargs.get("timeout"), "every probe needs a timeout"
        answer = answers.get(tuple(argv[:2]), answers.get(argv[0], FileNotFoundError(argv[0])))
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(argv, rc, out, err)

    run.calls = calls
    return run


def test_nvidia_smi_fallback_adds_cuda_version():
    runner = fake_runner(
        {
            ("nvidia-smi", hardware.SMI_QUERY[1]): (0, fixture("h200.csv"), ""),
            "nvidia-smi": (0, fixture("h200-header.txt"), ""),
        }
    )
    gpus = hardware.gpus_from_nvidia_smi(runner)
    assert len(gpus) == 2
    assert {g.cuda_version for g in gpus} == {"12.4"}


def test_nvidia_smi_missing_or_hanging_is_none():
    assert hardware.gpus_from_nvidia_smi(fake_runner({})) is None
    hang = subprocess.TimeoutExpired("nvidia-smi", 15)
    assert hardware.gpus_from_nvidia_smi(fake_runner({"nvidia-smi": hang})) is None
    assert hardware.gpus_from_nvidia_smi(fake_runner({"nvidia-smi": (9, "", "no driver")})) is None


# --- collect and render ------------------------------------------------------------------------------------------

Usage = namedtuple("Usage", "total used free")
MEMINFO = "MemTotal:       24683652 kB\nMemFree:        24517396 kB\nMemAvailable:   24440092 kB\n"


def probes(*, on_path=(), files=None, answers=None, nvml=None, system=("linux", "x86_64")):
    files = files or {}
    return hardware.Probes(
        run=fake_runner(answers or {}),
        which=lambda name: f"/usr/bin/{name}" if name in on_path else None,
        exists=lambda path: path in files,
        glob=lambda pattern: sorted(p for p in files if Path(p).match(pattern)),
        read_text=files.get,
        system=lambda: system,
        disk_usage=lambda path: Usage(500 * 2**30, 100 * 2**30, 400 * 2**30),
        nvml=nvml or FakeNvml([], fail_init=True),
        cwd="/data",
    )


def test_collect_nothing_found():
    report = doctor.collect(probes(files={"/proc/meminfo": MEMINFO}))
    assert report["gpus"] == []
    assert report["gpu_source"] is None
    assert report["unsupported_accelerators"] == []
    assert [(e["name"], e["path"], e["answers"]) for e in report["engines"]] == [
        ("docker", None, False),
        ("podman", None, False),
    ]
    assert report["toolkit"] == {"nvidia_ctk": None, "runtime": None, "cdi_specs": []}
    assert report["images"] == {}
    assert report["memory"] == {"total_mib": 24105, "available_mib": 23867}
    assert report["disk"] == {"path": "/data", "free_gib": 400.0, "total_gib": 500.0}
    assert report["verdict"][0].startswith("no NVIDIA GPU found")
    lines = doctor.render(report)
    assert "GPUs: no NVIDIA GPU found" in lines
    assert "memory: 23867 MiB available of 24105 MiB" in lines


def test_collect_gpu_host_with_docker_and_images():
    inspect = json.dumps([{"Id": "sha256:" + "ab" * 32, "RepoDigests": []}])
    answers = {
        ("docker", "version"): (
            0,
            json.dumps({"Client": {"Version": "27.1"}, "Server": {"Version": "27.1.1"}}),
            "",
        ),
        ("docker", "image"): (0, inspect, ""),
        ("nvidia-ctk", "--version"): (0, "NVIDIA Container Toolkit CLI version 1.16.2\ncommit: x\n", ""),
    }
    files = {"/etc/cdi/nvidia.yaml": "cdiVersion: 0.5.0\n"}
    report = doctor.collect(probes(on_path={"docker"}, files=files, answers=answers, nvml=FakeNvml([H200])))
    assert report["gpu_source"] == "nvml"
    assert report["gpus"][0]["compute_capability"] == [9, 0]
    assert report["gpus"][0]["dtype"] == "bfloat16"
    docker = report["engines"][0]
    assert (docker["answers"], docker["version"]) == (True, "27.1.1")
    assert report["toolkit"]["nvidia_ctk"] == "NVIDIA Container Toolkit CLI version 1.16.2"
    assert report["toolkit"]["cdi_specs"] == ["/etc/cdi/nvidia.yaml"]
    assert set(report["images"]["docker"]) == set(IMAGES)
    assert report["images"]["docker"]["vllm"]["present"] is True
    assert report["images"]["docker"]["vllm"]["reference"] == image_reference("vllm")
    # What images.lock.json leaves unpinned is flagged on every host (the lock is the repository's own).
    assert report["verdict"][0] == "1 NVIDIA GPU(s) via nvml; models run in bfloat16"
    # The fake driver (550, CUDA 12.4) is too old for the images' CUDA 13.0: named, with the fix.
    old = [v for v in report["verdict"][1:] if v.startswith("driver 550.90.07 supports CUDA up to 12.4")]
    assert len(old) == 1 and "580 branch or newer" in old[0] and "cuda-compat-13-0" in old[0]
    assert [v for v in report["verdict"][1:] if not v.startswith("not pinned: ") and v not in old] == []
    assert json.loads(json.dumps(report)) == report
    assert any("NVIDIA H200, compute 9.0, bfloat16" in line for line in doctor.render(report))


def test_collect_engine_down_and_images_missing():
    answers = {
        ("docker", "version"): (
            1,
            '{"Client":{"Version":"28.2.2"},"Server":null}',
            "Cannot connect to the Docker daemon\n",
        ),
        ("podman", "version"): (0, json.dumps({"Client": {"Version": "5.2.0"}}), ""),
        ("podman", "image"): (125, "[]", "Error: no such image"),
        ("nvidia-ctk", "--version"): subprocess.TimeoutExpired("nvidia-ctk", 5),
    }
    report = doctor.collect(probes(on_path={"docker", "podman"}, answers=answers))
    docker, podman = report["engines"]
    assert (docker["answers"], docker["error"]) == (False, "Cannot connect to the Docker daemon")
    assert (podman["answers"], podman["version"]) == (True, "5.2.0")
    assert list(report["images"]) == ["podman"]
    assert not any(e["present"] for e in report["images"]["podman"].values())
    assert f"podman: images not built: {', '.join(IMAGES)}; run `make images`" in report["verdict"]


def test_collect_engine_timeout_is_not_answering():
    answers = {("docker", "version"): subprocess.TimeoutExpired("docker", 5)}
    report = doctor.collect(probes(on_path={"docker"}, answers=answers))
    assert report["engines"][0]["answers"] is False
    assert "no answer" in report["engines"][0]["error"]


@pytest.mark.parametrize(
    ("kw", "vendor"),
    [
        ({"files": {"/dev/kfd": ""}}, "AMD"),
        ({"on_path": {"rocm-smi"}}, "AMD"),
        ({"files": {"/sys/class/drm/renderD128/device/vendor": "0x1002\n"}}, "AMD"),
        ({"on_path": {"xpu-smi"}}, "Intel"),
        ({"files": {"/sys/class/drm/renderD128/device/vendor": "0x8086\n"}}, "Intel"),
        ({"system": ("darwin", "arm64")}, "Apple"),
    ],
)
def test_unsupported_accelerators(kw, vendor):
    report = doctor.collect(probes(**kw))
    assert [a["vendor"] for a in report["unsupported_accelerators"]] == [vendor]
    assert any(line.startswith(f"{vendor} ") and "not supported" in line for line in report["verdict"])
    assert report["gpus"] == []


def test_nvidia_drm_device_is_not_unsupported():
    assert (
        hardware.unsupported_accelerators(
            probes(files={"/sys/class/drm/renderD128/device/vendor": "0x10de\n"})
        )
        == []
    )


def test_collect_on_this_host():
    """The real probes: never raises; on a machine without NVIDIA devices the answer is 'no NVIDIA GPU'."""
    report = doctor.collect()
    json.dumps(report)
    lines = doctor.render(report)
    assert lines[-len(report["verdict"]) - 1] == "verdict:"
    if shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl"):
        pytest.skip("this host has NVIDIA devices; the no-GPU answer cannot be checked here")
    assert report["gpus"] == []
    assert report["gpu_source"] is None
    assert "GPUs: no NVIDIA GPU found" in lines
    assert any("no NVIDIA GPU" in line for line in report["verdict"])


def test_doctor_imports_nothing_heavy():
    code = "import sys, draftscope.ops.doctor; bad = {'torch', 'pynvml', 'numpy'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)
    assert out.stdout.strip() == "[]"


def test_gpu_dataclass_is_frozen():
    gpu = hardware.Gpu(0, "Tesla T4", None, (7, 5), 15360, 15000, "535.183.01")
    with pytest.raises(AttributeError):
        gpu.name = "x"
    assert gpu.as_dict()["compute_capability"] == [7, 5]
    assert gpu.as_dict()["dtype"] == "float16"


def test_unpinned_bases_are_flagged_not_hidden():
    from draftscope.ops.images import load_lock, unpinned

    report = doctor.collect(probes())
    expected = [f"not pinned: {line}" for line in unpinned(load_lock())]
    assert [v.split(" (run ")[0] for v in report["verdict"] if v.startswith("not pinned: ")] == expected
    # The fix offered fits the cause: a registry base is resolved by images.lock; a local one has nothing to resolve.
    local = {v.split(":")[1].strip(): v for v in report["verdict"] if "built locally" in v}
    assert sorted(local) == ["sglang", "sglang-cpu", "train", "vllm", "vllm-cpu"]
    for name in ("sglang", "vllm", "vllm-cpu"):
        assert local[name].startswith(
            f"not pinned: {name}: base localhost/debian-py:ci is built locally and has no registry digest ("
        )
        # the lock's reason, not the registry fix
        assert f"invoke images.push {name}" in local[name] and "(run `invoke images.lock`" not in local[name]


def test_a_checkout_copy_without_git_takes_the_stated_commit(monkeypatch):
    from draftscope.core import provenance

    monkeypatch.setattr(provenance, "repo_root", lambda: None)
    monkeypatch.setenv(provenance.COMMIT_ENV, "a" * 40)
    monkeypatch.setenv(provenance.DIRTY_ENV, "1")
    assert provenance.kit_info()["git_commit"] == "a" * 40 and provenance.kit_info()["git_dirty"] is True
    monkeypatch.setenv(provenance.COMMIT_ENV, "not-a-sha")
    assert provenance.kit_info()["git_commit"] is None
