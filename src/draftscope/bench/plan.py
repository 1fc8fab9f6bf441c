"""Planning: config + preset → a Plan of Steps. Pure and torch-free; `--dry-run` prints a Plan and stops.

A Step says everything a runtime needs to execute one unit of work in its image: the in-container argv,
mounts, environment (values, and credentials passed by name only), GPUs, time limit and outputs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from draftscope.bench import backends
from draftscope.bench.backends import Backend
from draftscope.core import datasets
from draftscope.core.config import to_dict
from draftscope.core.errors import UserError
from draftscope.core.hub import hub_cache_dir
from draftscope.core.jsonio import parse_json, read_bytes
from draftscope.core.presets import (
    ExperimentConfig,
    HubRef,
    ModelPreset,
    load_model_preset,
    resolve_draft,
    resolve_target,
)
from draftscope.core.resources import resolve_path
from draftscope.core.schema import check
from draftscope.head.vllm_switch import env_for as prefix_head_env
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT, Mount, Step, fetch_step, limits_for


@dataclass(frozen=True)
class Download:
    repo: str
    revision: str | None
    role: str
    destination: str


@dataclass(frozen=True)
class Prompts:
    path: str
    sha256: str
    count: int  # the prompts a run uses (the first `max_prompts` of the file)
    total: int = 0  # the prompts in the file
    source: dict[str, Any] | None = (
        None  # the file's `source` (invoke datasets.import): format, commit, licence
    )
    dataset: str | None = None  # the shipped set it is (--dataset)


@dataclass(frozen=True)
class Plan:
    experiment: ExperimentConfig
    preset: ModelPreset
    target: HubRef | None
    draft: HubRef | None
    prompts: Prompts
    downloads: tuple[Download, ...]
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()

    @property
    def backend(self) -> Backend:
        """The benchmark backend's spec: its image, platform needs, notes and dry-run pieces."""
        return backends.get(self.experiment.backend)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def load_prompts(path: str, limit: int | None = None) -> Prompts:
    resolved = resolve_path(path)
    if not resolved.exists():
        raise UserError(
            "prompt file not found", field="prompts", value=path, fix="give --prompts a JSON prompt file"
        )
    # The reading boundary: a regular file (a FIFO or a directory is refused, never read), within the one size
    # limit (checked before reading: a larger file is a dataset or a log, and would be copied into every run),
    # parsed within its limits. Hashed from the same bytes that were checked.
    raw = read_bytes(resolved)
    data = parse_json(raw, str(resolved), expect=dict)
    check(data, "prompts", str(resolved))
    ids = [p["id"] for p in data["prompts"]]
    datasets.check_unique_ids(ids, str(resolved))
    count = len(datasets.selected(ids, limit))
    return Prompts(str(resolved), hashlib.sha256(raw).hexdigest(), count, len(ids), data.get("source"))


def prompt_overrides(prompts: str | None, dataset: str | None, max_prompts: int | None) -> dict[str, Any]:
    """`--prompts`, `--dataset` (a shipped set, whose file becomes `prompts`) and `--max-prompts` (parsed: the
    option table's) as config overrides; `--prompts` and `--dataset` both name the prompts, so only one may be
    given."""
    if prompts is not None and dataset is not None:
        raise UserError(
            "--prompts and --dataset both name the prompt file",
            field="--dataset",
            value=dataset,
            fix=f"drop --prompts to run the shipped set '{dataset}', or drop --dataset to run {prompts}",
        )
    given: dict[str, Any] = {"prompts": prompts, "max_prompts": max_prompts}
    if dataset is not None:
        given |= {"dataset": dataset, "prompts": str(datasets.shipped(dataset).path)}
    return given


def prompts_for(config: ExperimentConfig) -> Prompts:
    """The prompt file a run uses: the shipped set `dataset` names (its pinned SHA-256 checked), else `prompts`.
    With both (a reproduction points `prompts` at the run's copy), the file must be the set's, byte for byte."""
    if config.dataset is None:
        return load_prompts(config.prompts, config.max_prompts)
    shipped = datasets.shipped(config.dataset)
    default = config.prompts == ExperimentConfig.__dataclass_fields__["prompts"].default
    prompts = load_prompts(str(shipped.path) if default else config.prompts, config.max_prompts)
    if prompts.sha256 != shipped.sha256:
        raise UserError(
            f"the prompt file is not the shipped set '{config.dataset}' (its SHA-256 differs)",
            source=prompts.path,
            field="prompts",
            fix="give --dataset alone or --prompts alone",
        )
    return replace(prompts, dataset=config.dataset)


def plan_benchmark(config: ExperimentConfig, output: str | None = None) -> Plan:
    """The steps of one benchmark: fetch the pinned weights (hub presets), then the bounded benchmark worker.
    The backend's own config rules are checked here, first: every run, dry run and Slurm submission plans."""
    backend = backends.get(config.backend)
    backend.check(config)
    preset = load_model_preset(config.model_preset)
    target = resolve_target(config, preset)
    draft = resolve_draft(config, preset)
    prompts = prompts_for(config)
    run_dir = output or f"runs/{config.name}-<timestamp>"
    cache = hub_cache_dir()
    notes: list[str] = []

    downloads = tuple(
        Download(ref.repo, ref.revision, role, str(cache))
        for role, ref in (("target", target), ("draft", draft))
        if ref is not None
    )
    for d in downloads:
        if d.revision is None:
            notes.append(
                f"{d.role} {d.repo} is not pinned: a real run refuses it until a full commit SHA is set"
            )
    if preset.source == "kit":
        notes.append(
            f"model preset '{preset.name}' is built by the kit (invoke tiny.build); nothing is downloaded"
        )
    notes.extend(backend.notes(config, preset))

    gpus = 0 if config.device == "cpu" else -1
    steps: list[Step] = []
    if downloads:
        steps.append(fetch_step([(d.repo, d.revision) for d in downloads], str(cache), config.container))

    env = {"HF_HUB_CACHE": CACHE_MOUNT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env |= prefix_head_env(config, RUN_MOUNT)  # {} unless experimental_prefix
    steps.append(
        Step(
            name="benchmark",
            image=backend.image_for(config.device),
            argv=("python", "-m", "draftscope", "worker", "benchmark", "--run-dir", RUN_MOUNT),
            mounts=(Mount(str(Path(run_dir)), RUN_MOUNT, read_only=False), Mount(str(cache), CACHE_MOUNT)),
            env=MappingProxyType(env),
            gpus=gpus,
            ipc_host=backend.ipc_host,
            network=False,  # weights are local by now: the worker needs no network (and gets no credential)
            limits=limits_for(config.container, gpus=gpus),
            max_seconds=config.max_seconds,
            outputs=("manifest.json", "records.jsonl", "summary.json"),
            output_schema="summary",
        )
    )
    return Plan(config, preset, target, draft, prompts, downloads, tuple(steps), tuple(notes))
