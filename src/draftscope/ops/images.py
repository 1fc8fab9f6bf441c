"""The kit's pinned images: names, the step → image map, `images/images.lock.json`, and engine argv.

Each image lives in `images/<name>/` (Dockerfile, requirements.in, hash-pinned requirements.lock);
`images/images.lock.json` records its reference, base (by digest where known), pinned versions, the lock
file's SHA-256 and the SHA-256 of the kit wheel it installs (`make dist` records it with `record_wheel`), and
`consistency_problems` checks that record against the Dockerfiles and lock files.

Everything here is pure and torch-free: functions return argv lists for `docker` or `podman` (the engine is
a parameter); `execute` is the one place that runs them. Build, pull, push and lock resolution need a checkout
(the Dockerfiles and the build context live there); the name → reference map works anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.core.errors import UserError, run_main

IMAGES = ("transformers", "vllm", "train", "sglang")

# Which image runs which step.
STEP_IMAGES = {
    "benchmark:transformers": "transformers",
    "benchmark:vllm": "vllm",
    "fetch": "transformers",
    "regen": "vllm",
    "pretokenize": "train",
    "prepare": "train",
    "hsextract": "train",
    "train": "train",
    "convert": "train",
    "serve": "sglang",
    "bench": "sglang",
}

ENGINES = ("docker", "podman")
LOCK_FILE = "images.lock.json"
SOURCE_URL = "https://github.com/draftscope/draftscope"
SPECULATORS_REPO = "https://github.com/vllm-project/speculators"
# Where the transformers image's CPU test path finds its torch wheel (bind-mounted, never copied).
WHEELS_DIR = ".wheels"
# Where `make dist` leaves the kit's wheel and sdist. Every image installs that wheel, bind-mounted from here, by
# the SHA-256 each image's entry in images.lock.json records (`wheel_sha256`).
DIST_DIR = "dist"

# `uv pip compile` target of each image's lock: (Python, platform). sglang's wheels are manylinux_2_34 only.
LOCK_TARGETS = {
    "transformers": ("3.11", "x86_64-manylinux_2_28"),
    "vllm": ("3.12", "x86_64-manylinux_2_28"),
    "train": ("3.12", "x86_64-manylinux_2_28"),
    "sglang": ("3.12", "x86_64-manylinux_2_34"),
}
# images.lock.json `versions` keys that name a Python package, checked against the `==` lines of the lock.
VERSION_PACKAGES = ("torch", "transformers", "vllm", "sglang", "speculators")

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# One CUDA architecture as TORCH_CUDA_ARCH_LIST spells it: 8.0, 9.0a, 10.0+PTX.
_ARCH = re.compile(r"^\d{1,2}\.\d[a-f]?(\+PTX)?$")

Runner = Callable[..., subprocess.CompletedProcess]


# --- names and references -----------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if name not in IMAGES:
        raise UserError(f"no image named '{name}'", field="image", fix=f"choose one of: {', '.join(IMAGES)}")


def _default_reference(name: str) -> str:
    # `localhost/` keeps engines from looking the name up in a registry.
    return f"localhost/draftscope-{name}:{__version__}"


def image_reference(name: str) -> str:
    """The reference an image is built and run under: from images.lock.json in a checkout, else the default."""
    _check_name(name)
    try:
        entry = load_lock()["images"].get(name)
    except UserError:
        entry = None
    return entry["reference"] if entry else _default_reference(name)


def split_reference(reference: str) -> tuple[str, str | None, str | None]:
    """`repo[:tag][@sha256:…]` → (repo, tag, digest). A port in the registry host is not a tag."""
    ref, _, digest = reference.partition("@")
    repo, tag = ref, None
    head, sep, tail = ref.rpartition(":")
    if sep and "/" not in tail:
        repo, tag = head, tail
    return repo, tag, digest or None


# --- the checkout and images.lock.json ----------------------------------------------------------------------


def repo_root() -> Path:
    """The checkout the images are built from; a UserError when the kit runs from an installed wheel."""
    from draftscope.core.resources import repo_root as _root

    root = _root()
    if root is None or not (root / "images").is_dir():
        raise UserError(
            "the images are built from a checkout of the kit, and this is an installed copy",
            fix=f"clone {SOURCE_URL} and run the task there",
        )
    return root


def lock_path(root: Path | None = None) -> Path:
    return (root or repo_root()) / "images" / LOCK_FILE


def load_lock(path: Path | None = None) -> dict[str, Any]:
    """images.lock.json, validated against schemas/images-lock.schema.json."""
    from draftscope.core import schema

    path = path or lock_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist", fix="restore it from the repository") from None
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})", fix="restore it from the repository") from None
    schema.check(data, "images-lock", str(path))
    return data


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
    from draftscope.core import schema

    path = lock_path(root)
    try:  # not load_lock: a lock that predates wheel_sha256 is valid only once it has one
        lock = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is unreadable ({exc})", fix="restore it from the repository") from None
    digest = sha256_file(wheel)
    changed = False
    for entry in lock.get("images", {}).values():
        changed |= entry.get("wheel_sha256") != digest
        entry["wheel_sha256"] = digest
    schema.check(lock, "images-lock", str(path))
    if changed:
        path.write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return digest, changed


def lock_entry(name: str, lock: Mapping[str, Any] | None = None) -> dict[str, Any]:
    _check_name(name)
    lock = lock if lock is not None else load_lock()
    entry = lock["images"].get(name)
    if entry is None:
        raise UserError(f"image '{name}' is missing from images/{LOCK_FILE}", fix="restore the file")
    return entry


def base_reference(entry: Mapping[str, Any]) -> str:
    """The base as FROM sees it: `ref@digest` when the digest is known, else the bare reference."""
    base = entry["base"]
    return f"{base['reference']}@{base['digest']}" if base["digest"] else base["reference"]


def unpinned(lock: Mapping[str, Any]) -> list[str]:
    """One line per thing images.lock.json leaves unpinned (bases without a digest, missing commits)."""
    lines = []
    for name, entry in lock["images"].items():
        if not entry["base"]["digest"]:
            lines.append(f"{name}: base {entry['base']['reference']} is not pinned by digest")
        if name == "train" and not entry["versions"].get("speculators_commit"):
            lines.append(f"{name}: the speculators scripts are not pinned to a commit")
    return lines


# --- Dockerfiles and lock files -----------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    root = root or repo_root()
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
    import tomllib

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
        if key in pins:
            if pins[key] != versions[key]:
                problems.append(f"versions.{key}={versions[key]} but the lock pins {key}=={pins[key]}")
        elif not _from_base(name, key, versions[key], entry, lock):
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
    if name == "train":
        commit = versions.get("speculators_commit")
        if commit is not None and not _COMMIT.match(commit):
            problems.append(f"versions.speculators_commit={commit} is not a full 40-character commit SHA")
        if (args.get("SPECULATORS_COMMIT") or None) != commit:
            problems.append(
                f"Dockerfile ARG SPECULATORS_COMMIT={args.get('SPECULATORS_COMMIT')} but the lock says {commit}"
            )
        if versions.get("speculators") and args.get("SPECULATORS_REF") != f"v{versions['speculators']}":
            problems.append(
                f"Dockerfile ARG SPECULATORS_REF={args.get('SPECULATORS_REF')} is not the release tag"
            )
    return problems


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _from_base(name: str, key: str, version: str, entry: Mapping[str, Any], lock: Mapping[str, Any]) -> bool:
    """A version the base image provides: vLLM from the vllm-openai tag; its torch as the train lock pins it."""
    if name != "vllm":
        return False
    _, tag, _ = split_reference(entry["base"]["reference"])
    if key == "vllm":
        return tag == f"v{version}"
    train = lock["images"].get("train", {}).get("versions", {})
    # vLLM pins torch exactly: the train lock, which holds the same vLLM, shows the torch it brings.
    return train.get("vllm") == entry["versions"].get("vllm") and train.get(key) == version


# --- lock compilation ---------------------------------------------------------------------------------------


def compile_argv(name: str, output: str | None = None, uv: str = "uv") -> list[str]:
    """`uv pip compile` for one image's lock, run from the repository root (UV_PYTHON_DOWNLOADS=never)."""
    _check_name(name)
    python, platform = LOCK_TARGETS[name]
    folder = f"images/{name}"
    command = (
        f"UV_PYTHON_DOWNLOADS=never uv pip compile --generate-hashes --python-version {python}"
        f" --python-platform {platform} {folder}/requirements.in -o {folder}/requirements.lock"
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
        f"{folder}/requirements.in",
        "-o",
        output or f"{folder}/requirements.lock",
    ]


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


def source_date_epoch(env: Mapping[str, str], commit_time: int | None) -> int:
    """`SOURCE_DATE_EPOCH` from the environment (reproducible-builds convention), else the commit time."""
    value = env.get("SOURCE_DATE_EPOCH")
    if value:
        if not value.isdigit():
            raise UserError("not a Unix time in seconds", field="SOURCE_DATE_EPOCH", value=value)
        return int(value)
    if commit_time is None:
        raise UserError(
            "cannot date the build: no git commit here and SOURCE_DATE_EPOCH is not set",
            fix="build from a git checkout or export SOURCE_DATE_EPOCH=<unix seconds>",
        )
    return commit_time


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- CUDA architectures for the vllm image's extension ------------------------------------------------------


def validate_cuda_arch(text: str, source: str = "--cuda-arch") -> str:
    """Normalise `9.0`, `8.0;9.0` or `8.0 9.0` to `8.0;9.0`; reject empty lists and `all`."""
    parts = [p for p in re.split(r"[;,\s]+", text.strip()) if p]
    if not parts:
        raise UserError("the CUDA architecture list is empty", field=source, fix="pass e.g. 9.0 or '8.0;9.0'")
    bad = [p for p in parts if not _ARCH.match(p)]
    if bad:
        raise UserError(
            "not a CUDA architecture (compute capability, like 8.0, 9.0a or 10.0+PTX)",
            field=source,
            value=bad[0],
            fix="list the target GPUs' compute capabilities, e.g. '8.0;9.0' (never 'all')",
        )
    return ";".join(dict.fromkeys(parts))


def cuda_arch_from_gpus(gpus: Sequence[Any]) -> str | None:
    """The distinct compute capabilities of GPUs (draftscope.ops.doctor.Gpu), sorted, as `8.0;9.0`."""
    caps = sorted({g.compute_capability for g in gpus if g.compute_capability})
    return ";".join(f"{major}.{minor}" for major, minor in caps) or None


def host_gpus() -> list[Any]:
    """NVIDIA GPUs of this host through draftscope.ops.doctor (NVML, else nvidia-smi); empty when none."""
    from draftscope.ops import doctor  # lazy: doctor imports this module

    gpus = doctor.gpus_from_nvml()
    if gpus is None:
        gpus = doctor.gpus_from_nvidia_smi()
    return gpus or []


def detect_cuda_arch(
    explicit: str | None,
    env: Mapping[str, str],
    gpus: Callable[[], Sequence[Any]] | None = None,
) -> tuple[str, str]:
    """(architecture list, where it came from): `--cuda-arch`, else `$CUDA_ARCH`, else the host's GPUs."""
    if explicit is not None:
        return validate_cuda_arch(explicit, "--cuda-arch"), "--cuda-arch"
    if env.get("CUDA_ARCH", "").strip():
        return validate_cuda_arch(env["CUDA_ARCH"], "CUDA_ARCH"), "CUDA_ARCH"
    found = cuda_arch_from_gpus((gpus or host_gpus)())
    if found:
        return found, "host GPUs"
    raise UserError(
        "the vllm image needs the CUDA architectures to build its extension for, and this host has no NVIDIA GPU"
        " to read them from",
        fix="pass CUDA_ARCH=9.0 (make) or --cuda-arch '8.0;9.0' (invoke) with the target GPUs' compute capability",
    )


# --- build --------------------------------------------------------------------------------------------------


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
    ]
    if name == "vllm":
        if not request.cuda_arch:
            raise UserError("the vllm image needs a CUDA architecture list", field="cuda_arch")
        args.append(("CUDA_ARCH", validate_cuda_arch(request.cuda_arch)))
    elif request.cuda_arch:
        raise UserError(
            f"only the vllm image builds for a CUDA architecture list, not '{name}'", field="--cuda-arch"
        )
    if request.torch_wheel or request.torch_wheel_sha256:
        if name != "transformers":
            raise UserError(
                f"only the transformers image takes a torch wheel, not '{name}'", field="--torch-wheel"
            )
        if not (request.torch_wheel and request.torch_wheel_sha256):
            raise UserError("a torch wheel needs both its file name and its SHA-256", field="--torch-wheel")
        args += [("TORCH_WHEEL", request.torch_wheel), ("TORCH_WHEEL_SHA256", request.torch_wheel_sha256)]
    if name == "train" and entry["versions"].get("speculators_commit"):
        args.append(("SPECULATORS_COMMIT", entry["versions"]["speculators_commit"]))
    _, _, digest = split_reference(base)
    labels = [
        ("org.opencontainers.image.source", SOURCE_URL),
        ("org.opencontainers.image.revision", request.revision or "unknown"),
        ("org.opencontainers.image.version", __version__),
        ("org.opencontainers.image.created", rfc3339(request.epoch)),
        ("org.opencontainers.image.base.name", base),
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


def torch_wheel(root: Path, name: str) -> tuple[str, str]:
    """(file name, SHA-256) of a torch wheel in `.wheels/` for the transformers image's CPU test path."""
    path = Path(name)
    if path.parent != Path("."):
        if path.resolve().parent != (root / WHEELS_DIR).resolve():
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


# --- pull, push, list ---------------------------------------------------------------------------------------


def pull_argv(name: str, engine: str, lock: Mapping[str, Any]) -> list[str]:
    """Pull a published image by digest (for reviewers); refuses images with no published digest."""
    entry = lock_entry(name, lock)
    repo, _, _ = split_reference(entry["reference"])
    if not entry.get("digest") or repo.startswith("localhost/"):
        raise UserError(
            f"image '{name}' has no published digest in images/{LOCK_FILE}",
            fix=f"build it here with `make image-{name}`",
        )
    return [check_engine(engine), "pull", f"{repo}@{entry['digest']}"]


def push_argv(name: str, destination: str, engine: str, lock: Mapping[str, Any]) -> list[list[str]]:
    """Tag the local image as `destination` (REGISTRY/REPO[:TAG]) and push it."""
    entry = lock_entry(name, lock)
    repo, tag, digest = split_reference(destination)
    if digest or "/" not in repo or repo.startswith("localhost/"):
        raise UserError(
            "not a registry destination",
            field="--to",
            value=destination,
            fix="pass REGISTRY/NAMESPACE/REPO[:TAG], e.g. ghcr.io/me/draftscope-vllm",
        )
    target = f"{repo}:{tag or entry['tag']}"
    engine = check_engine(engine)
    return [[engine, "tag", entry["reference"], target], [engine, "push", target]]


def inspect_argv(name: str, engine: str, lock: Mapping[str, Any]) -> list[str]:
    return [check_engine(engine), "image", "inspect", lock_entry(name, lock)["reference"]]


def parse_inspect(stdout: str) -> dict[str, Any] | None:
    """`Id`, `RepoDigests` and labels from `ENGINE image inspect` output; None when it is not an image."""
    try:
        data = json.loads(stdout)[0]
    except (ValueError, LookupError, TypeError):
        return None
    labels = (data.get("Config") or {}).get("Labels") or data.get("Labels") or {}
    return {"id": data.get("Id"), "repo_digests": data.get("RepoDigests") or [], "labels": labels}


# --- lock resolution (a machine that reaches the registries) ------------------------------------------------

RESOLVERS = ("buildx", "skopeo")


def resolve_digest_argv(reference: str, tool: str) -> list[str]:
    """Ask a registry for the digest a tag points at (the multi-platform index where there is one)."""
    repo, tag, _ = split_reference(reference)
    bare = f"{repo}:{tag}" if tag else repo
    if tool == "buildx":
        return ["docker", "buildx", "imagetools", "inspect", bare, "--format", "{{json .Manifest}}"]
    if tool == "skopeo":
        return ["skopeo", "inspect", "--raw", f"docker://{bare}"]
    raise UserError("unknown resolver", field="--tool", value=tool, fix=f"use one of: {', '.join(RESOLVERS)}")


def parse_digest(tool: str, stdout: str) -> str:
    """The digest from `resolve_digest_argv` output: buildx names it; skopeo's raw manifest is hashed."""
    if tool == "skopeo":
        return "sha256:" + hashlib.sha256(stdout.encode()).hexdigest()
    try:
        digest = json.loads(stdout)["digest"]
    except (ValueError, LookupError, TypeError):
        digest = None
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise UserError(
            "the registry answer names no digest", source="docker buildx imagetools", value=stdout
        )
    return digest


def ls_remote_argv(ref: str) -> list[str]:
    return ["git", "ls-remote", SPECULATORS_REPO, f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"]


def parse_ls_remote(stdout: str, ref: str) -> str:
    """The commit a tag names (the peeled `^{}` line of an annotated tag wins)."""
    found = dict(reversed(line.split()) for line in stdout.splitlines() if len(line.split()) == 2)
    commit = found.get(f"refs/tags/{ref}^{{}}") or found.get(f"refs/tags/{ref}")
    if not commit or not _COMMIT.match(commit):
        raise UserError(f"tag {ref} not found", source=SPECULATORS_REPO, fix="check the release tag")
    return commit


def set_dockerfile_arg(text: str, name: str, value: str) -> str:
    """Rewrite the default of `ARG NAME=…` (the first declaration); other lines stay byte-identical."""
    pattern = re.compile(rf"^(\s*ARG\s+{name})(?:=.*)?$", re.MULTILINE)
    if not pattern.search(text):
        raise UserError(f"the Dockerfile declares no ARG {name}", field=name)
    return pattern.sub(lambda m: f"{m.group(1)}={value}", text, count=1)


def execute(
    argv: Sequence[str], *, cwd: Path | None = None, capture: bool = False, runner: Runner = subprocess.run
):
    """Run one argv (never through a shell); a missing binary is a UserError, the exit code is the caller's."""
    try:
        return runner(
            list(argv), cwd=cwd, check=False, text=True, capture_output=capture, env=os.environ.copy()
        )
    except FileNotFoundError:
        raise UserError(f"'{argv[0]}' is not installed or not on PATH", fix=f"install {argv[0]}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m draftscope.ops.images record-wheel [DIST]`: the step of `make dist` that records the wheel's hash."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "record-wheel" or len(args) > 2:
        print("usage: python -m draftscope.ops.images record-wheel [DIST_DIR]", file=sys.stderr)
        return 2

    def record() -> int:
        digest, changed = record_wheel(repo_root(), Path(args[1]) if len(args) == 2 else None)
        state = "recorded in" if changed else "already in"
        print(f"{kit_wheel_name()} sha256 {digest}: {state} images/{LOCK_FILE}")
        return 0

    return run_main(record)


if __name__ == "__main__":
    raise SystemExit(main())
