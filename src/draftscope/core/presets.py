"""Model and experiment presets: small YAML files under `presets/`, each validated by its schema.

A model preset names a target (hub repository + full commit SHA, or the kit-built `tiny`), its published
drafts, and the DFlash geometry the pipeline trains with. An experiment preset is a complete benchmark
configuration; the command line may override its fields, and the result is frozen into the run manifest.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from draftscope.core.config import (
    build,
    build_as_typed,
    deep_merge,
    load_yaml,
    parse_opts,
    typed_by,
    validated,
    validated_as_typed,
)
from draftscope.core.errors import UserError
from draftscope.core.hub import is_pinned
from draftscope.core.resources import presets_dir


def pin_fix(role: str, repo: str) -> str:
    """How to pin `repo` in a form the benchmark accepts as typed: the flags of its role (--revision pins only a
    --model; a preset's own target is pinned in the preset), or the preset file."""
    flags = "--draft {} --draft-revision" if role.startswith("draft") else "--model {} --revision"
    return (
        f"pass {flags.format(repo)} FULL_40_HEX_SHA (a commit you checked: the repository's hub page → "
        f"'Files and versions' → the commit, or `huggingface_hub.HfApi().model_info('{repo}').sha`), or set its "
        "revision in the model preset (presets/models/)"
    )


# --- model presets ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubRef:
    repo: str
    revision: str | None = None
    notes: str = ""

    @property
    def pinned(self) -> bool:
        return is_pinned(self.revision)  # the one pin rule (core.hub)

    def display(self) -> str:
        return f"{self.repo}@{self.revision or '<unpinned: no public commit SHA recorded>'}"

    def require_pinned(self, what: str, *, fix: str | None = None) -> None:
        """Real runs refuse an unpinned model (its weights could change under the same name); `fix`: a command's
        own, else the benchmark's flags for `what` (target or draft)."""
        if not self.pinned:
            raise UserError(
                f"{what} {self.repo} has no pinned revision",
                field="revision",
                fix=fix or pin_fix(what, self.repo),
            )


@dataclass(frozen=True)
class Architecture:
    kind: Literal["dense", "moe", "hybrid", "hybrid-moe"]
    model_type: str
    num_layers: int
    vocab_size: int
    max_position_embeddings: int
    hidden_size: int | None = None
    parameters_b: float | None = None
    active_parameters_b: float | None = None
    notes: str = ""

    @property
    def is_hybrid(self) -> bool:
        """Linear-attention (GDN / Mamba-style) layers: vLLM needs the custom all-reduce off (docs/develop/integration-bugs.md, bug 1)."""
        return self.kind.startswith("hybrid")


@dataclass(frozen=True)
class KitModel:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    draft_hidden_size: int
    draft_num_layers: int
    corpus: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    measured: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DFlashGeometry:
    block_size: int
    decay_gamma: float
    target_layer_ids: tuple[int, ...]
    num_draft_layers: int
    mask_token_id: int | None = None


@dataclass(frozen=True)
class Training:
    seq_length: int
    max_anchors: int
    nproc_per_node: int
    epochs: int | None = None
    lr: float | None = None


@dataclass(frozen=True)
class Serving:
    tp_size: int
    instances: int = 1
    context_length: int | None = None


@dataclass(frozen=True)
class Status:
    tested: bool
    notes: str = ""


@dataclass(frozen=True)
class Drafts:
    dflash: HubRef | None = None
    dflash2: HubRef | None = None
    dspark: HubRef | None = None


@dataclass(frozen=True)
class ModelPreset:
    schema_version: int
    name: str
    display_name: str
    source: Literal["hub", "kit"]
    architecture: Architecture
    dflash: DFlashGeometry
    training: Training
    serving: Serving
    status: Status
    description: str = ""
    hub: HubRef | None = None
    int4: HubRef | None = None
    drafts: Drafts = field(default_factory=Drafts)
    kit_model: KitModel | None = None
    references: tuple[str, ...] = ()
    path: str = ""  # the file it came from; not part of the YAML

    def __post_init__(self) -> None:
        too_deep = [i for i in self.dflash.target_layer_ids if i >= self.architecture.num_layers]
        if too_deep:
            raise UserError(
                f"target layer ids {too_deep} do not exist in a {self.architecture.num_layers}-layer model",
                source=self.path or self.name,
                field="dflash.target_layer_ids",
                fix=f"use ids between 0 and {self.architecture.num_layers - 1}",
            )
        if list(self.dflash.target_layer_ids) != sorted(self.dflash.target_layer_ids):
            raise UserError(
                "target layer ids must be in increasing order",
                source=self.path or self.name,
                field="dflash.target_layer_ids",
                value=list(self.dflash.target_layer_ids),
            )


# --- experiment configs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmOptions:
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    attention_backend: str | None = None


_SIZE_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3}


def size_bytes(size: str) -> int:
    """docker's size notation (digits and a unit k, m or g, as the schema admits) in bytes."""
    return int(size[:-1]) * _SIZE_UNITS[size[-1]]


@dataclass(frozen=True)
class ContainerOptions:
    """A run's container limits (`container:` in an experiment or pipeline config); None: the step kind's default.
    The schema checks the notation; the floor the engines need is checked here, naming the field."""

    memory: str | None = None
    pids: int | None = None
    shm_size: str | None = None

    def __post_init__(self) -> None:
        if self.memory is not None and size_bytes(self.memory) < 64 * 1024**2:
            raise UserError(
                "a container memory limit under 64 MiB leaves no room for Python and the model",
                field="container.memory",
                value=self.memory,
                fix="give at least 64m, e.g. --opts container.memory=8g",
            )


@dataclass(frozen=True)
class HeadOptions:
    """The target head in the kit's speculative loop (Transformers backend; docs/review/head.md)."""

    policy: Literal["dense", "rowwise", "prefix"] = "dense"
    k: int = 64  # candidates refined per row beyond the top 2
    group_size: int | None = None  # INT8 scale groups; None = one scale per row
    shadow: bool = False  # also run the dense head every step and count disagreements (must be 0)
    capture: int = 0  # record the first N verification calls for `invoke head-study`


@dataclass(frozen=True)
class ExperimentConfig:
    """One benchmark configuration. Defaults are the kit's; presets and the command line override them."""

    schema_version: int
    name: str
    backend: str  # a name of bench/backends (BACKENDS), checked when the benchmark is planned
    model_preset: str
    description: str = ""
    model: str | None = None
    revision: str | None = None
    draft: str | None = None
    draft_revision: str | None = None
    draft_tokens: int = 4
    int4_dflash: bool = False
    experimental_prefix: bool = False
    prompts: str = "examples/prompts.json"
    dataset: str | None = None  # a shipped prompt set (core/datasets.py): its file replaces `prompts`
    max_prompts: int | None = None  # the first N prompts only, in file order
    repeats: int = 5
    warmups: int = 1
    max_seconds: float = 600.0
    max_new_tokens: int = 256
    fixed_tokens: int | None = None
    memory_fraction: float = 0.9
    device: Literal["cuda", "cpu"] = "cuda"
    runtime: Literal["docker", "podman", "local"] = "docker"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    seed: int = 0
    vllm: VllmOptions = field(default_factory=VllmOptions)
    head: HeadOptions = field(default_factory=HeadOptions)
    container: ContainerOptions = field(default_factory=ContainerOptions)

    def __post_init__(self) -> None:
        # Cross-field rules the schema cannot state; each names the field and the fix. The rules of one backend
        # (what it runs, on which device) are its own, checked when a benchmark is planned (bench/backends/).
        if self.model is not None and self.revision is None:
            raise UserError(
                "a custom model needs a full commit revision",
                field="revision",
                value=None,
                fix=f"add --revision FULL_40_HEX_SHA for {self.model}",
            )
        if self.revision is not None and self.model is None:
            raise UserError(
                "--revision is given without --model",
                field="revision",
                value=self.revision,
                fix="add --model OWNER/NAME, or drop --revision to use the preset's pin",
            )
        if self.draft == "tiny" and self.model_preset != "tiny":
            raise UserError(
                "the kit-built tiny draft pairs only with the tiny target",
                field="draft",
                value="tiny",
                fix="add --preset tiny, or give --draft OWNER/NAME --draft-revision SHA",
            )
        if self.draft not in (None, "tiny") and self.draft_revision is None:
            raise UserError(
                "a custom draft needs a full commit revision",
                field="draft_revision",
                value=None,
                fix=f"add --draft-revision FULL_40_HEX_SHA for {self.draft}",
            )


# --- loading ------------------------------------------------------------------------------------------------

MODEL_DIR = "models"
EXPERIMENT_DIR = "experiments"


def _preset_files(kind: str) -> dict[str, Path]:
    folder = presets_dir() / kind
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def model_preset_names() -> list[str]:
    return list(_preset_files(MODEL_DIR))


def experiment_preset_names() -> list[str]:
    return list(_preset_files(EXPERIMENT_DIR))


def _find(kind: str, name: str, what: str) -> Path:
    files = _preset_files(kind)
    if name in files:
        return files[name]
    # A path to a YAML file of one's own is accepted too.
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    hint = difflib.get_close_matches(name, list(files), n=1)
    suggestion = f"did you mean '{hint[0]}'? " if hint else ""
    raise UserError(
        f"no {what} named '{name}'", field=what, fix=f"{suggestion}choose one of: {', '.join(files)}"
    )


def _load_file(path: Path, schema: str) -> dict[str, Any]:
    data = validated(load_yaml(path), schema, str(path))
    if path.parent.name in (MODEL_DIR, EXPERIMENT_DIR) and data["name"] != path.stem:
        raise UserError(
            f"name '{data['name']}' differs from the file name",
            source=str(path),
            field="name",
            fix=f"set name: {path.stem} or rename the file",
        )
    return data


def load_model_preset(name: str) -> ModelPreset:
    path = _find(MODEL_DIR, name, "model preset")
    data = _load_file(path, "model-preset")
    try:
        return replace(build(ModelPreset, data), path=str(path))
    except UserError as exc:
        if exc.source is None:
            raise UserError(
                exc.message, source=str(path), field=exc.field, value=exc.value, fix=exc.fix
            ) from None
        raise


def load_experiment(
    name: str,
    overrides: Mapping[str, Any] | None = None,
    opts: Iterable[str] = (),
    *,
    flags: Mapping[str, str] | None = None,
) -> ExperimentConfig:
    """An experiment preset with overrides (typed options, then `--opts key=value`), validated as a whole. `flags`
    names the option that set each field (`{"device": "--device"}`): its problems are that option's, as typed."""
    path = _find(EXPERIMENT_DIR, name, "experiment preset")
    data = _load_file(path, "experiment")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    from_opts = parse_opts(opts)
    merged = deep_merge(deep_merge(data, given), from_opts)
    source = f"{path} (with overrides)" if (overrides or opts) else str(path)
    typed = typed_by(flags, given, from_opts)
    validated_as_typed(merged, "experiment", source, typed)
    config: ExperimentConfig = build_as_typed(ExperimentConfig, merged, typed)
    load_model_preset(config.model_preset)  # an unknown model preset is an error here, not at run time
    return config


def resolve_target(config: ExperimentConfig, preset: ModelPreset) -> HubRef | None:
    """The target checkpoint a run loads: an explicit --model, the preset's INT4 checkpoint, or its hub model."""
    if config.model is not None:
        return HubRef(config.model, config.revision)
    if config.int4_dflash:
        if preset.int4 is None:
            raise UserError(
                f"model preset '{preset.name}' names no INT4 checkpoint",
                field="int4_dflash",
                fix="choose a preset with an 'int4' entry, or pass --model and --revision",
            )
        return preset.int4
    return preset.hub  # None for the kit-built tiny model


def resolve_draft(config: ExperimentConfig, preset: ModelPreset) -> HubRef | None:
    """The draft checkpoint to download, if any (the kit-built tiny draft is never downloaded)."""
    if config.draft == "tiny":
        return None
    if config.draft is not None:
        return HubRef(config.draft, config.draft_revision)
    if config.int4_dflash:
        if preset.drafts.dflash2 is None:
            raise UserError(
                f"model preset '{preset.name}' names no DFlash2 draft",
                field="drafts.dflash2",
                fix="choose a preset with a dflash2 draft, or pass --draft and --draft-revision",
            )
        return preset.drafts.dflash2
    return None
