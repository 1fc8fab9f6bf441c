"""A Step: everything a runtime needs to run one unit of work in its image — the in-container argv, mounts,
environment (values, and credentials passed by name only), GPUs, time limit and outputs. The runtime's own type:
planners (bench, pipeline) build Steps, runtimes execute them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Paths inside the containers.
RUN_MOUNT = "/draftscope/run"
CACHE_MOUNT = "/draftscope/cache/huggingface"
# Credentials are handed to containers by name (`-e NAME`), so their values never appear in an argv or a manifest.
CREDENTIALS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class Step:
    name: str
    image: str
    argv: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    env_passthrough: tuple[str, ...] = ()
    gpus: int = 0  # 0: no GPU; -1: all GPUs; N: that many
    ipc_host: bool = False
    network: bool = False
    time_limit_s: float | None = None
    outputs: tuple[str, ...] = ()
    output_schema: str | None = None
