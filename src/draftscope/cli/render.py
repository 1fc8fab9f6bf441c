"""Terminal output for the host-side commands (rich), kept apart from the logic that produces the data."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from draftscope.bench.plan import Plan
from draftscope.core.config import to_dict
from draftscope.core.presets import ExperimentConfig, ModelPreset
from draftscope.core.provenance import shell_join
from draftscope.runtime.step import Step


def console() -> Console:
    # Wide when piped (tables are not squeezed into 80 columns); no colour codes in files.
    probe = Console()
    return Console(highlight=False, width=None if probe.is_terminal else 160)


def preset_table(models: Iterable[ModelPreset], experiments: Iterable[ExperimentConfig]) -> list[Table]:
    mt = Table(title="Model presets", title_justify="left")
    for col in ("name", "model", "revision", "arch", "layers", "block/γ", "target layers", "tested"):
        mt.add_column(col, overflow="fold")
    for p in models:
        model = p.hub.repo if p.hub else "(built by the kit)"
        rev = (p.hub.revision[:12] + "…") if p.hub and p.hub.revision else ("unpinned" if p.hub else "-")
        mt.add_row(
            p.name,
            model,
            rev,
            p.architecture.kind,
            str(p.architecture.num_layers),
            f"{p.dflash.block_size}/{p.dflash.decay_gamma:g}",
            " ".join(map(str, p.dflash.target_layer_ids)),
            "yes" if p.status.tested else "no",
        )
    et = Table(title="Experiment presets", title_justify="left")
    for col in ("name", "backend", "model preset", "device/runtime", "description"):
        et.add_column(col, overflow="fold")
    for e in experiments:
        backend = (
            e.backend
            + (" int4+dflash2" if e.int4_dflash else "")
            + (" +prefix" if e.experimental_prefix else "")
        )
        et.add_row(e.name, backend, e.model_preset, f"{e.device}/{e.runtime}", e.description)
    return [mt, et]


def yaml_text(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False, allow_unicode=True, width=110)


def step_lines(step: Step) -> list[str]:
    gpus = {0: "none", -1: "all"}.get(step.gpus, str(step.gpus))
    lines = [
        f"  step {step.name}: image {step.image}, GPUs {gpus}, network {'on' if step.network else 'off'}"
        + (f", time limit {step.max_seconds:g} s" if step.max_seconds else ""),
        f"    argv: {shell_join(list(step.argv))}",
    ]
    for m in step.mounts:
        lines.append(f"    mount: {m.source} -> {m.target} ({'ro' if m.read_only else 'rw'})")
    for key, value in sorted(step.env.items()):
        lines.append(f"    env: {key}={value}")
    if step.env_passthrough:
        lines.append(f"    env by name (values never recorded): {', '.join(step.env_passthrough)}")
    if step.credentials:
        lines.append(f"    credentials by name (values never recorded): {', '.join(step.credentials)}")
    shm = "host IPC" if step.ipc_host else f"shm {step.limits.shm_size}"
    lines.append(
        f"    container limits: memory {step.limits.memory} (no swap), pids {step.limits.pids}, {shm};"
        " read-only root, tmpfs /tmp"
    )
    return lines


def plan_lines(plan: Plan, image_ref) -> list[str]:
    e, p = plan.experiment, plan.preset
    target = (
        plan.target.display() if plan.target else f"{p.display_name} (built by the kit, preset '{p.name}')"
    )
    lines = [
        f"experiment {e.name}: backend {e.backend}"
        + (", INT4 + DFlash2" if e.int4_dflash else "")
        + (", experimental prefix head" if e.experimental_prefix else ""),
        f"  image: {image_ref(plan.steps[-1].image)}",
        f"  target: {target}",
    ]
    if plan.draft:
        spec = plan.backend.draft_detail(p)
        lines.append(f"  draft: {plan.draft.display()}{spec}")
    lines += [
        f"  prompts: {plan.prompts.path} ({prompt_count(plan.prompts)}, sha256 {plan.prompts.sha256})",
        f"  repeats {e.repeats}, warm-ups {e.warmups}, max new tokens {e.max_new_tokens}"
        + (f", fixed tokens {e.fixed_tokens}" if e.fixed_tokens else "")
        + f"; time limit {e.max_seconds:g} s (loading and warm-ups included)",
        f"  device {e.device}, dtype {e.dtype}, memory fraction {e.memory_fraction:g}, runtime {e.runtime}",
    ]
    if plan.downloads:
        for d in plan.downloads:
            lines.append(f"  download: {d.repo}@{d.revision or '<unpinned>'} ({d.role}) -> {d.destination}")
    else:
        lines.append("  download: nothing")
    for step in plan.steps:
        lines += step_lines(step)
    lines += [f"  note: {n}" for n in plan.notes]
    return lines


def print_json(obj: Any) -> None:
    """JSON on stdout, indented, keys in their given order; what JSON cannot hold (paths, times) as text."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    print()


def prompt_count(prompts: Any) -> str:
    """'12 prompts', or 'first 3 of 80 prompts'; with the shipped set's name and its upstream commit if any."""
    text = (
        f"{prompts.count} prompts"
        if prompts.count == prompts.total
        else f"first {prompts.count} of {prompts.total} prompts"
    )
    source = prompts.source or {}
    if prompts.dataset:
        text += f"; dataset {prompts.dataset}"
    if source.get("commit"):
        text += f" from {source.get('repository')} @ {source['commit'][:12]}, {source.get('licence')}"
    return text
