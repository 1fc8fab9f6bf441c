"""The host side installs and runs without torch: a fresh venv with only `pip install .` (no extras)."""

import subprocess
import sys

import pytest

from support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def host_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("hostenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # A real (non-editable) install: the wheel must carry the schemas, presets and examples it needs.
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return venv


def test_no_torch_in_the_host_environment(host_venv):
    python = str(host_venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    assert probe.returncode != 0, "the host install must not pull torch in"
    code = "import draftscope, sys; assert 'torch' not in sys.modules; print(draftscope.__version__)"
    subprocess.run([python, "-c", code], check=True)


def test_installed_command_plans_outside_the_checkout(host_venv, tmp_path):
    result = subprocess.run(
        [str(host_venv / "bin" / "draftscope"), "plan", "--experiment", "vllm-int4-dflash2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "z-lab/Qwen3.8-27B-DFlash2@50307d4c4cde6860d4eee73e2547cd786fe8e8a4" in result.stdout
    assert "/_data/examples/prompts.json" in result.stdout  # found inside the installed package
