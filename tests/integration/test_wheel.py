"""The release: `python -m build` makes a wheel and an sdist that `twine check` passes; a fresh venv with only the
wheel (plus the `local` extra) plans, dry-runs the pipeline, benchmarks the tiny models on the CPU and validates the
run, from a directory outside the checkout. The version comes from one place."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from draftscope import __version__
from draftscope.ops.images import kit_wheel_name, load_lock

from support import ROOT, tiny_benchmark, unavailable

pytestmark = pytest.mark.integration

# The CPU torch the rest of the suite uses (`make setup`'s TORCH_SPEC); pip finds it on the local index.
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")


def _missing_tools() -> list[str]:
    return [m for m in ("build", "twine") if importlib.util.find_spec(m) is None]


def _run(argv, *, cwd, timeout=600, env=None):
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    missing = _missing_tools()
    if missing:
        unavailable(f"needs {' and '.join(missing)} (the dev extra: pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("dist")
    done = _run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist):
    return dist / kit_wheel_name()


@pytest.fixture(scope="module")
def wheel_venv(wheel, tmp_path_factory):
    """A fresh venv: the CPU torch, then the wheel with the `local` extra. Nothing of the checkout."""
    venv = tmp_path_factory.mktemp("wheelenv") / "venv"
    outside = venv.parent
    steps = [
        [sys.executable, "-m", "venv", venv],
        [venv / "bin/python", "-m", "pip", "install", "--quiet", *TORCH_SPEC.split()],
        [venv / "bin/python", "-m", "pip", "install", "--quiet", f"{wheel}[local]"],
    ]
    for argv in steps:
        done = _run(argv, cwd=outside, timeout=1200)
        assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    return venv


def _draftscope(venv: Path, *args: str, cwd: Path, timeout: float = 300):
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DRAFTSCOPE_PRESETS", "VIRTUAL_ENV")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return _run([venv / "bin" / "draftscope", *args], cwd=cwd, timeout=timeout, env=env)


# --- the version, in one place ------------------------------------------------------------------------------------


def test_version_is_canonical_and_everything_names_it():
    from packaging.version import Version

    assert str(Version(__version__)) == __version__, "the version must be in canonical PEP 440 form"
    init = (ROOT / "src/draftscope/__init__.py").read_text()
    assert re.findall(r'^__version__ = "([^"]+)"$', init, re.MULTILINE) == [__version__]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["version"] == __version__
    assert {e["tag"] for e in load_lock()["images"].values()} == {__version__}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog or f"## [{__version__}]" in changelog


def test_citation_has_what_cff_requires():
    """The structural part of CFF 1.2.0 (CI runs the full validator, cffconvert, in its own environment)."""
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert cff["message"] and cff["title"] and cff["authors"]
    assert all(("name" in a) or ("family-names" in a) for a in cff["authors"])
    assert cff["license"] == "Apache-2.0"


def test_notice_names_what_the_kit_wraps():
    text = (ROOT / "NOTICE").read_text()
    for name in ("speculators", "SGLang", "vLLM", "Transformers", "PyTorch", "PSF-2.0", "Apache"):
        assert name in text, name


# --- the built files ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_build_and_twine_check(dist):
    assert sorted(p.name for p in dist.iterdir()) == sorted(
        [f"draftscope-{__version__}.tar.gz", kit_wheel_name()]
    )
    done = _run([sys.executable, "-m", "twine", "check", "--strict", *sorted(dist.iterdir())], cwd=dist)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_wheel_carries_the_data_and_nothing_of_the_tests(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    data = "draftscope/_data"
    for folder, top in (("schemas", "schemas"), ("presets", "presets"), ("examples", "examples")):
        shipped = {n.removeprefix(f"{data}/{folder}/") for n in names if n.startswith(f"{data}/{folder}/")}
        expected = {p.relative_to(ROOT / top).as_posix() for p in (ROOT / top).rglob("*") if p.is_file()}
        assert shipped == expected, folder
    tiny = {
        p.relative_to(ROOT / "src").as_posix()
        for p in (ROOT / "src/draftscope/assets").rglob("*")
        if p.is_file()
    }
    assert tiny and tiny <= set(names)
    info = f"draftscope-{__version__}.dist-info"
    assert {f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE", f"{info}/entry_points.txt"} <= set(names)
    assert not [
        n for n in names if n.startswith("tests/") or "/tests/" in n or "conftest" in n or "__pycache__" in n
    ]
    assert not [n for n in names if not n.startswith(("draftscope/", info))]
    assert "images.lock.json" not in " ".join(names), (
        "the lock records the wheel's hash: it cannot be inside it"
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sdist_holds_the_sources_and_the_release_files(dist):
    with tarfile.open(dist / f"draftscope-{__version__}.tar.gz") as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "NOTICE",
        "CITATION.cff",
        "CHANGELOG.md",
        "PKG-INFO",
    } <= names
    assert "src/draftscope/__init__.py" in names and "schemas/common.schema.json" in names
    assert not [n for n in names if n.startswith(("tests/", "runs/", ".venv", "dist/", "images/"))]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_wheel_is_reproducible(dist, tmp_path):
    """The same sources build the same bytes: what lets images.lock.json pin the wheel by its hash. (Rebuilt from
    the sdist, as `python -m build` built the first one, so that edits to the tree meanwhile do not matter.)"""
    with tarfile.open(dist / f"draftscope-{__version__}.tar.gz") as tar:
        tar.extractall(tmp_path / "src", filter="data")
    source = tmp_path / "src" / f"draftscope-{__version__}"
    done = _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "out", source], cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / kit_wheel_name()).read_bytes() == (dist / kit_wheel_name()).read_bytes()


# --- a venv with only the wheel -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_wheel_alone_plans_dry_runs_benchmarks_and_validates(wheel_venv, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = _run(
        [
            wheel_venv / "bin/python",
            "-c",
            "import draftscope.core.resources as r; print(r.repo_root(), r.schemas_dir())",
        ],
        cwd=work,
    )
    assert probe.returncode == 0 and probe.stdout.startswith("None "), probe.stdout + probe.stderr
    assert str(ROOT) not in probe.stdout

    version = _draftscope(wheel_venv, "--version", cwd=work)
    assert version.returncode == 0 and version.stdout.strip() == f"draftscope {__version__}", version.stdout

    plan = _draftscope(wheel_venv, "plan", cwd=work)
    assert plan.returncode == 0, plan.stderr
    assert "/_data/examples/prompts.json" in plan.stdout

    pipeline = _draftscope(wheel_venv, "pipeline", "--stage", "all", "--dry-run", cwd=work)
    assert pipeline.returncode == 0, pipeline.stderr
    stages = re.findall(r"^# \[(\d)/8\] (\w+):", pipeline.stdout, re.MULTILINE)
    assert [s for _, s in stages] == [
        "regen",
        "pretokenize",
        "prepare",
        "hsextract",
        "train",
        "convert",
        "serve",
        "bench",
    ], pipeline.stdout[:2000]
    assert not (work / "runs").exists(), "a dry run creates nothing"

    args = tiny_benchmark("local", "--repeats", "1", "--max-new-tokens", "8", "--draft", "tiny")
    bench = _draftscope(wheel_venv, *args, "--output", "tiny-run", cwd=work, timeout=900)
    assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
    manifest = json.loads((work / "tiny-run" / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert manifest["kit"] == {"version": __version__, "git_commit": None, "git_dirty": None}
    assert manifest["inputs"][0]["path"].endswith("_data/examples/prompts.json")

    valid = _draftscope(wheel_venv, "validate", "tiny-run", cwd=work)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert "file(s) valid" in valid.stdout

    shared = _draftscope(wheel_venv, "share", "tiny-run", "--output", "tiny-run.tar.gz", cwd=work)
    assert shared.returncode == 0, shared.stderr
    assert (work / "tiny-run.tar.gz").is_file()
