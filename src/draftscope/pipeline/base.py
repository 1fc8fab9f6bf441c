"""What every stage shares: the stage declaration, the context it is planned in, paths, and server instances.

A stage is a small declarative object (`Stage`), one per subpackage `stages/<name>/`: name, image, what it reads
and writes, its output schema, functions that build — purely, without touching the disk — the in-container argv
and the processes that argv starts, and the in-container commands (`Entry`) that argv runs. The planner turns it
into a `Step` for a runtime; the same functions serve the dry run and the real run, so what `--dry-run` prints is
what runs. Nothing outside the stage asks for it by name: the plan, the runner and `python -m draftscope.pipeline`
read its declaration.

Layer ids. A preset's `dflash.target_layer_ids` are 0-based indices of the target's decoder layers whose outputs
feed the draft — SGLang's (and z-lab's) `dflash_config.target_layer_ids`. speculators counts hidden states the
way Transformers' `hidden_states` tuple does (index 0 = embeddings, k = output of layer k-1), so its
`--target-layer-ids` and a checkpoint's `aux_hidden_state_layer_ids` are the preset's ids plus one, and hsextract
appends the last index (= the layer count) for the verifier's final hidden state, as speculators' launcher does.
convert maps them back (minus one).
"""

from __future__ import annotations

import argparse
import shlex
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.hub import hub_cache_dir, hub_snapshot
from draftscope.core.presets import ModelPreset
from draftscope.core.progress import Probe
from draftscope.pipeline.config import Instance, PipelineConfig
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT, Mount
from draftscope.tiny.assets import assets_dir

# Container paths besides the run directory (RUN_MOUNT) and the hub cache (CACHE_MOUNT).
MODELS_MOUNT = "/draftscope/models"
DRAFT_MODEL_MOUNT = f"{MODELS_MOUNT}/draft-model"  # serve.draft_model, read-only
INPUTS_MOUNT = "/draftscope/inputs"

# Workdir layout (relative to the workdir).
STAGES_DIR = "stages"
CONFIG_FILE = "pipeline.json"


@dataclass(frozen=True)
class Command:
    """One process a stage starts inside its container: argv, extra environment, GPUs and port (servers)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gpus: tuple[int, ...] = ()
    port: int | None = None

    def display(self) -> str:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": dict(self.env),
            "gpus": list(self.gpus),
            "port": self.port,
        }


@dataclass(frozen=True)
class Artifact:
    """A file or folder a stage reads or writes, by its path on the host (for hashing and checks)."""

    name: str
    path: Path
    kind: str = "file"  # file | tree
    required: bool = True
    schema: str | None = None  # an output validated against this schema before the stage counts as completed


@dataclass(frozen=True)
class Layout:
    """Paths as the stage's process sees them: container paths, or the host's for the local runtime."""

    run: str
    model: str
    tokenizer: str
    chat: str  # data.chat
    prompts: str  # bench.prompts

    def at(self, *parts: str) -> str:
        return "/".join([self.run.rstrip("/"), *parts])


@dataclass(frozen=True)
class StageContext:
    config: PipelineConfig
    preset: ModelPreset
    workdir: Path  # on the host, absolute
    runtime: str  # docker | podman | local
    layout: Layout
    mounts: tuple[Mount, ...]
    inputs: Mapping[str, Path]  # external input files on the host, by name (chat, prompts)
    selected: frozenset[str] = frozenset()

    @property
    def local(self) -> bool:
        return self.runtime == "local"

    @property
    def cpu(self) -> bool:
        return self.config.device == "cpu"

    def host(self, *parts: str) -> Path:
        return self.workdir.joinpath(*parts)


@dataclass(frozen=True)
class Entry:
    """One in-container command of a stage: `python -m draftscope.pipeline NAME --result FILE ARGS…`.

    The stage's argv builder names it (`kit_argv`); `python -m draftscope.pipeline` builds its parser from
    `add_arguments` and runs `main`, which returns the counts for the stage's result file. An unrecorded entry is a
    helper process the stage starts (the tiny target's server): it takes no `--result` and `main` returns its exit
    code."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    main: Callable[[argparse.Namespace], Any]
    recorded: bool = True


# The key under which a stage's in-container entry returns notes for its record beside its counts.
NOTES = "notes"


@dataclass(frozen=True)
class Stage:
    """A stage: what it is, where it runs, what it reads and writes, how its commands are built and what runs them
    in the container. The registry (`registry.STAGES`) lists it; nothing else names it."""

    name: str
    image: str  # the image its step runs in (core.images.IMAGES)
    summary: str
    uses_gpu: bool
    output_schema: str | None
    outputs: Callable[[StageContext], list[Artifact]]
    inputs: Callable[[StageContext], list[Artifact]]
    argv: Callable[[StageContext], list[str]]  # the container's command
    commands: Callable[[StageContext], list[Command]] = lambda ctx: []  # what that command starts, if several
    env: Callable[[StageContext], dict[str, str]] = lambda ctx: {}
    notes: Callable[[StageContext], list[str]] = lambda ctx: []
    # The in-container commands its argv runs; none when it runs an upstream command under `exec` (`exec_argv`).
    entries: tuple[Entry, ...] = ()
    # The Linux-only engine it starts for a real target (core.platforms.LINUX_ONLY); a real run elsewhere is refused.
    # The tiny preset's path starts none (a loopback server, a Transformers extractor), so it runs anywhere.
    engine: str | None = None
    cpu_refusal: str | None = None  # why it cannot run with `device: cpu`, when it cannot
    # The image its step runs in with `device: cpu`, when not `image` (serve, bench: sglang-cpu, SGLang's CPU engine).
    cpu_image: str | None = None
    # Refusals of a `device: cpu` run that depend on the run's settings or the host (a UserError with its fix),
    # made in the preflight, before any stage starts.
    cpu_check: Callable[[StageContext], None] = lambda ctx: None
    # Reads what it takes from outside the workdir before anything is written, so a malformed file leaves no state.
    check_inputs: Callable[[StageContext], None] = lambda ctx: None
    # Its live progress read from its log (a `core.progress` probe, made when the stage starts); without one the
    # runner counts rows, or shows the log's last line.
    progress: Callable[[Path], Probe] | None = None


# --- paths ---------------------------------------------------------------------------------------------------


def chat_input(ctx: StageContext) -> Artifact:
    """The chat rows file (`data.chat`); a placeholder when unset, which a real run refuses (`runner.preflight`)."""
    path = ctx.inputs.get("chat")
    return Artifact("chat", path if path is not None else Path("<data.chat is not set>"))


def chat_file(ctx: StageContext) -> Path | None:
    """The chat rows file on the host when it is configured and exists (what `check_inputs` reads)."""
    path = ctx.inputs.get("chat")
    return path if path is not None and path.is_file() else None


def tiny_assets() -> Path:
    return assets_dir()


def model_mounts_and_paths(
    config: PipelineConfig, preset: ModelPreset, local: bool
) -> tuple[list[Mount], str, str]:
    """Mounts for the target, and the target's (model, tokenizer) paths as a stage sees them."""
    if preset.source == "kit":
        assets = tiny_assets()
        root = str(assets) if local else f"{MODELS_MOUNT}/tiny"
        # The tiny tokenizer sits beside the model folders (draftscope.tiny.assets).
        return [Mount(str(assets), f"{MODELS_MOUNT}/tiny")], f"{root}/target", root
    if config.model_path is not None:
        source = str(Path(config.model_path).absolute())
        path = source if local else f"{MODELS_MOUNT}/target"
        return [Mount(source, f"{MODELS_MOUNT}/target")], path, path
    assert preset.hub is not None
    revision = preset.hub.revision or "<unpinned>"
    cache = hub_cache_dir()
    path = hub_snapshot(str(cache) if local else CACHE_MOUNT, preset.hub.repo, revision)
    return [Mount(str(cache), CACHE_MOUNT)], path, path


def host_model_paths(config: PipelineConfig, preset: ModelPreset) -> tuple[Path, Path]:
    """The target's (model, tokenizer) folders on the host."""
    _, model, tokenizer = model_mounts_and_paths(config, preset, local=True)
    return Path(model), Path(tokenizer)


def served_context_length(ctx: StageContext) -> int:
    """The context SGLang serves the draft at (serve's `--context-length`; convert's mask probe covers it)."""
    return (
        ctx.config.serve.context_length or ctx.preset.serving.context_length or ctx.preset.training.seq_length
    )


def model_artifacts(ctx: StageContext) -> list[Artifact]:
    """What identifies the target for a stage's inputs: its config (weights are pinned by the revision in it path)."""
    model, _ = host_model_paths(ctx.config, ctx.preset)
    return [Artifact("target config", model / "config.json")]


def tokenizer_artifacts(ctx: StageContext) -> list[Artifact]:
    """The tokenizer files a chat template and token ids depend on (those present)."""
    _, folder = host_model_paths(ctx.config, ctx.preset)
    names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
    return [Artifact(f"tokenizer {n}", folder / n, required=False) for n in names]


# --- the layer-id conventions (see the module docstring) ----------------------------------------------------


def speculators_layer_ids(preset: ModelPreset) -> list[int]:
    """speculators' `--target-layer-ids` (hidden-state indices): the preset's layer ids plus one."""
    return [i + 1 for i in preset.dflash.target_layer_ids]


def captured_layer_ids(preset: ModelPreset) -> list[int]:
    """Every hidden-state index extracted per row: the auxiliary ones, then the final layer's (= layer count)."""
    return [*speculators_layer_ids(preset), preset.architecture.num_layers]


# --- server instances: GPU masks, tensor parallelism, ports (docs/develop/integration-bugs.md, bug 5) -----------------------------


@dataclass(frozen=True)
class ResolvedInstance:
    index: int
    gpus: tuple[int, ...]
    tp: int
    port: int

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices} if self.gpus else {}

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"


def resolve_instances(
    ctx: StageContext, configured: Sequence[Instance], base_port: int, what: str
) -> list[ResolvedInstance]:
    """The configured instances, or the preset's default (`serving.instances` × `serving.tp_size`, consecutive
    GPUs from 0), checked: TP equals the mask size, no GPU in two instances, every GPU on the machine, distinct
    ports. On the CPU (tiny preset) there is one instance and no GPU."""
    config, preset = ctx.config, ctx.preset
    if ctx.cpu:
        if configured and any(i.gpus for i in configured):
            raise UserError(
                "a CPU run has no GPUs to assign", field=f"{what}.instances", fix="remove the gpus lists"
            )
        port = (configured[0].port if configured else None) or base_port
        return [ResolvedInstance(0, (), 1, port)]
    if not configured:
        tp = preset.serving.tp_size
        count = preset.serving.instances
        configured = [Instance(gpus=tuple(range(i * tp, (i + 1) * tp)), tp=tp) for i in range(count)]
    resolved = [
        ResolvedInstance(i, tuple(inst.gpus), inst.tp or len(inst.gpus), inst.port or base_port + i)
        for i, inst in enumerate(configured)
    ]
    validate_instances(resolved, config.gpus, f"{what}.instances")
    return resolved


def validate_instances(instances: Sequence[ResolvedInstance], gpu_count: int, where: str) -> None:
    """One-line errors for a plan that would share a GPU, mis-size tensor parallelism or reuse a port."""
    seen: dict[int, int] = {}
    ports: dict[int, int] = {}
    for inst in instances:
        label = f"{where}[{inst.index}]"
        if not inst.gpus:
            raise UserError(
                "an instance needs at least one GPU", field=f"{label}.gpus", fix="list its GPU indices"
            )
        if inst.tp != len(inst.gpus):
            raise UserError(
                f"tensor-parallel size {inst.tp} differs from the {len(inst.gpus)} GPU(s) in its mask "
                f"{list(inst.gpus)}",
                field=f"{label}.tp",
                fix=f"set tp: {len(inst.gpus)} or give the instance {inst.tp} GPU(s)",
            )
        for gpu in inst.gpus:
            if gpu >= gpu_count:
                raise UserError(
                    f"GPU {gpu} does not exist on a {gpu_count}-GPU machine",
                    field=f"{label}.gpus",
                    fix=f"use indices 0..{gpu_count - 1}, or set gpus: N to the machine's GPU count",
                )
            if gpu in seen:
                raise UserError(
                    f"GPU {gpu} is in the masks of instances {seen[gpu]} and {inst.index}; instances never share a GPU",
                    field=f"{label}.gpus",
                    fix="give each instance its own GPUs",
                )
            seen[gpu] = inst.index
        if inst.port in ports:
            raise UserError(
                f"port {inst.port} is used by instances {ports[inst.port]} and {inst.index}",
                field=f"{label}.port",
                fix="give each instance its own port",
            )
        ports[inst.port] = inst.index


def check_ports_free(instances: Sequence[ResolvedInstance], where: str, host: str = "127.0.0.1") -> None:
    """Before anything starts: every instance's port can be bound (nothing else listens there)."""
    for inst in instances:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As servers bind: connections of an earlier run in TIME_WAIT do not make the port busy.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, inst.port))
            except OSError:
                raise UserError(
                    f"port {inst.port} is already in use on {host}",
                    field=f"{where}[{inst.index}].port",
                    fix="stop what listens there or choose another port",
                ) from None


def hybrid_vllm_flags(preset: ModelPreset) -> list[str]:
    """Integration bug 1: vLLM's custom all-reduce crashes on GDN (linear-attention) targets; the multiprocessing
    executor avoids it. `VLLM_BATCH_INVARIANT` is never set for them (no stage sets it at all)."""
    if not preset.architecture.is_hybrid:
        return []
    return ["--disable-custom-all-reduce", "--distributed-executor-backend", "mp"]


def offline_env() -> dict[str, str]:
    """Weights are local by the time a stage runs: no stage reaches a model hub."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_CACHE": CACHE_MOUNT}


def run_mount(workdir: Path) -> Mount:
    return Mount(str(workdir), RUN_MOUNT, read_only=False)


def result_path(ctx: StageContext, stage: str) -> str:
    """Where a stage's in-container part writes what it learned (versions, counts, commands) for the record."""
    return ctx.layout.at(STAGES_DIR, f"{stage}.result.json")


def kit_argv(ctx: StageContext, stage: str, command: str, args: list[str]) -> list[str]:
    """A kit command run in the stage's image: `python -m draftscope.pipeline COMMAND --result R ARGS…`."""
    return ["python", "-m", "draftscope.pipeline", command, "--result", result_path(ctx, stage), *args]


def exec_argv(ctx: StageContext, stage: str, inner: list[str]) -> list[str]:
    """Run an upstream command through the kit's thin wrapper, which records versions, duration and the exit code
    (`python -m draftscope.pipeline exec`); the upstream argv follows `--` unchanged."""
    result = result_path(ctx, stage)
    return ["python", "-m", "draftscope.pipeline", "exec", "--result", result, stage, "--", *inner]
