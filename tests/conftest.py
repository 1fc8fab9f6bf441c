"""Shared fixtures. Tests mirror `src/`; markers (pyproject.toml) split them by cost and by what they need.

Helpers live in `tests/support.py` (this folder is on sys.path because this conftest lives here)."""

from __future__ import annotations

import pytest

from support import ROOT, run_invoke


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


@pytest.fixture(scope="session")
def engine() -> str:
    """A container engine that answers (containerlib): its version."""
    from containerlib import engine_version

    return engine_version()


@pytest.fixture(scope="session")
def kit_image(engine) -> str:
    """The kit's transformers image, built from its Dockerfile on the local base (containerlib): its reference."""
    from containerlib import build_kit_image

    return build_kit_image()


@pytest.fixture
def repo_root():
    return ROOT


@pytest.fixture
def invoke_cli():
    return run_invoke
