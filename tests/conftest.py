"""Shared fixtures. Tests mirror `src/`; markers (pyproject.toml) split them by cost (`slow`: `make test` leaves
them out, `make test-slow` runs them) and by what they need (the Makefile's other test tiers).

Helpers live in `tests/support.py` (this folder is on sys.path because this conftest lives here)."""

from __future__ import annotations

import os
import re
import signal
import sys
from functools import cache
from pathlib import Path

import pytest

from support import ROOT, run_invoke

# A shell that starts a job in the background without job control (`cmd &` in a script, nohup) leaves SIGINT
# ignored, and an ignored signal stays ignored in every child it execs: the Ctrl-C tests would send a signal nobody
# hears. Tests run with Python's own Ctrl-C handling, whatever started them; children get the default action.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Under pytest-xdist the workers share the cores: each worker (and every process it starts; the runtimes pass
# OMP_NUM_THREADS on) gets its share of them for torch's thread pool, instead of every worker spinning a pool as wide
# as the machine (2 workers × 2 threads on 2 cores thrashed). Set before any test module imports torch; a value
# already given wins.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if os.environ.get("PYTEST_XDIST_WORKER") and _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

# Tests mirror `src/` (tests/unit/<package>/). A few test modules also build inputs for tests in other folders
# (test_analysis_synthetic.make_run, test_pipeline_plan.build, test_pipeline_convert.checkpoint); each folder is on
# the path so that they import by module name, as they did before the split.
for _folder in sorted((ROOT / "tests" / "unit").iterdir()):
    if _folder.is_dir() and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# A test module that imports torch (directly, through importorskip, or through the kit's torch-backed modules) is
# marked `torch`: `make test-fast` leaves those out. Read from the module's text, so a new such module is marked too.
_TORCH = re.compile(
    r"^\s*(import torch\b|from torch\b|.*importorskip\([\"']torch[\"']\)"
    r"|from draftscope(\.decode| import decode|\.head\.(exact|quant|certify|runtime|graph|triton_kernels|bench|serving|"
    r"vllm_plugin|capture)\b| import tiny\b|\.tiny\.(train|builder|models)\b))",
    re.M,
)


@cache
def _uses_torch(path: Path) -> bool:
    try:
        return bool(_TORCH.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


def _long_first(items: list[pytest.Item]) -> None:
    """Modules with a `slow` test run first, then the modules that import torch (they load or run the tiny models:
    the long ones among the rest), then the others; each module's tests in their order. pytest-xdist (`--dist
    loadfile`) hands out whole modules in collection order: a long module handed out last keeps one worker busy
    while the other waits, so the long ones go first and the short ones fill in around them."""
    slow = {
        item.module.__name__ for item in items if item.get_closest_marker("slow") and item.module is not None
    }

    def rank(item: pytest.Item) -> int:
        if item.module is None:
            return 2
        return 0 if item.module.__name__ in slow else 1 if _uses_torch(Path(item.fspath)) else 2

    items.sort(key=rank)  # stable


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _long_first(items)
    for item in items:
        if _uses_torch(Path(item.fspath)):
            item.add_marker(pytest.mark.torch)
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


@pytest.fixture(scope="session")
def vllm_cpu_image(engine) -> tuple[str, float]:
    """The vllm-cpu image, built from its Dockerfile on the local base (containerlib): (reference, build seconds)."""
    from containerlib import build_vllm_cpu_image

    return build_vllm_cpu_image()


@pytest.fixture
def repo_root():
    return ROOT


@pytest.fixture
def invoke_cli():
    return run_invoke
