"""Shared fixtures. Tests mirror `src/`; markers (pyproject.toml) split them by cost and by what they need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "vllm", "sglang", "speculators", "triton")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a CUDA build of torch")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    return ROOT


def run_invoke(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60):
    """Run `invoke ARGS` as a user would, in a fresh interpreter."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def invoke_cli():
    return run_invoke
