"""Each image's requirements.lock re-resolves to itself with uv (needs the package index).

uv keeps the versions an existing output file pins, so re-running the lock's own compile command against a copy
of the committed lock must give the committed lock byte for byte; a difference means requirements.in and the
lock disagree, or a pinned release changed its files (new wheels, hence new hashes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftscope.ops import images as I

from support import unavailable

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.contract


def _uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        unavailable("uv is not installed (pip install uv)")
    return found


def _compile(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("name", I.IMAGES)
def test_lock_re_resolves_to_itself(name, tmp_path):
    uv = _uv()
    committed = ROOT / "images" / name / "requirements.lock"
    output = tmp_path / "requirements.lock"
    shutil.copy(committed, output)
    done = _compile(I.compile_argv(name, output=str(output), uv=uv))
    assert done.returncode == 0, done.stderr[-4000:]
    assert output.read_text() == committed.read_text(), (
        f"images/{name}/requirements.lock is stale: re-run its header"
    )


def test_transformers_lock_also_fits_python_3_12(tmp_path):
    """The lock is compiled for 3.11 (the CPU test path); the GPU image's 3.12 needs no other package."""
    uv = _uv()
    lock = ROOT / "images" / "transformers" / "requirements.lock"
    pins = "\n".join(f"{r.name}=={r.version}" for r in I.lock_requirements(lock.read_text()))
    constraints = tmp_path / "pins.txt"
    constraints.write_text(pins + "\n")
    output = tmp_path / "py312.txt"
    argv = [
        uv,
        "pip",
        "compile",
        "--quiet",
        "--python-version",
        "3.12",
        "--python-platform",
        "x86_64-manylinux_2_28",
    ]
    done = _compile([*argv, "images/transformers/requirements.in", "-c", str(constraints), "-o", str(output)])
    assert done.returncode == 0, done.stderr[-4000:]
    resolved = {(r.name, r.version) for r in I.lock_requirements(output.read_text())}
    assert resolved == {(r.name, r.version) for r in I.lock_requirements(lock.read_text())}
