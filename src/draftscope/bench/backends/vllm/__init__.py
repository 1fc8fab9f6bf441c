"""The vLLM backend: vLLM's V1 engine in the vllm image, on NVIDIA GPUs of Linux hosts (the INT4 target with its
DFlash2 draft, or any hub target); and its CPU variant, vLLM's CPU engine in the vllm-cpu image, for the kit-built
tiny target and draft (`cpu.py`). Its config side (`config.py`) is pure; its engine (`backend.py`) imports vLLM
only when a run starts."""

from __future__ import annotations

from types import MappingProxyType

from draftscope.bench.backends.spec import Backend
from draftscope.bench.backends.vllm import config

BACKEND = Backend(
    name="vllm",
    image="vllm",
    engine="draftscope.bench.backends.vllm.backend:VllmBackend",
    devices=config.DEVICES,
    default_experiment="vllm-int4-dflash2",
    device_images=MappingProxyType({"cpu": config.CPU_IMAGE}),
    device_experiments=MappingProxyType({"cpu": config.CPU_EXPERIMENT}),
    linux_only=True,  # Linux-only wheels, for the GPU and the CPU build alike
    ipc_host=True,  # the multi-process executor shares memory through /dev/shm
    gpu_facts_via_nvml=True,  # vLLM holds its share of GPU memory before the worker reads the GPU's facts
    oom_markers=config.OOM_MARKERS,
    check=config.check,
    notes=config.notes,
    dry_run_lines=config.dry_run_lines,
    draft_detail=config.draft_detail,
    gpus_per_task=config.gpus_per_task,
)
