"""The kit-built tiny models: a ~2M-parameter Qwen3 target and a ~0.3M-parameter Qwen3 draft.

Trained on a CPU, offline, from the Python standard library's own sources (PSF-2.0), seeded and deterministic,
and shipped as bf16 safetensors under `draftscope/assets/tiny/` with their SHA-256 in the `tiny` preset, because
training takes too long to repeat in every CI run and demo. `invoke tiny.build` rebuilds them and says whether the
rebuild reproduced the shipped files; `invoke tiny.build --check` verifies the shipped files.

Importing this package does not import torch; the loaders and `build` do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.presets import load_model_preset
from draftscope.tiny import builder
from draftscope.tiny.assets import (
    PRESET,
    assets_dir,
    check_files,
    expected_files,
    load_draft,
    load_target,
    load_tokenizer,
    require_files,
    stage_for_vllm,
)
from draftscope.tiny.builder import DRAFT_STEPS, TARGET_STEPS, build, compare
from draftscope.tiny.models import parameter_count

__all__ = [
    "DRAFT_STEPS",
    "TARGET_STEPS",
    "assets_dir",
    "build",
    "check_files",
    "check_lines",
    "compare",
    "expected_files",
    "install",
    "load_draft",
    "load_target",
    "load_tokenizer",
    "progress_display",
    "report_lines",
    "require_files",
    "stage_for_vllm",
]


def install(folder: Path, record: dict[str, Any]) -> None:
    """Replace the shipped files with a build's and record its hashes and figures in the tiny preset."""
    preset = load_model_preset(PRESET)
    builder.install(folder, record, assets=assets_dir(), preset_path=Path(preset.path))


def check_lines() -> list[str]:
    """Verify the shipped files, then load tokenizer and target through `from_pretrained` with the hub disabled."""
    # Read by huggingface_hub when first imported; `local_files_only=True` below holds either way.
    settings.HF_HUB_OFFLINE.set("1")
    preset = load_model_preset(PRESET)
    require_files(preset)
    files = expected_files(preset)
    tokenizer = load_tokenizer(preset=preset, verify=False)
    target = load_target(preset=preset, verify=False)
    draft = load_draft(preset=preset, verify=False)

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    logits = target(input_ids=ids).logits
    lines = [f"ok  {rel}  {sha[:16]}…" for rel, sha in sorted(files.items())]
    lines.append(
        f"all {len(files)} file(s) in {assets_dir()} match kit_model.files of {preset.path}; the target "
        f"({parameter_count(target):,} parameters) and draft ({parameter_count(draft):,}) load offline through "
        f"from_pretrained; a forward pass gives logits of shape {tuple(logits.shape)}"
    )
    measured = preset.kit_model.measured if preset.kit_model else {}
    if "target_validation_loss" in measured:
        lines.append(
            f"recorded: target validation loss {measured['target_validation_loss']}, mean top-1 probability "
            f"{measured.get('target_mean_top1_prob')}, draft tokens per target call at k=4 "
            f"{measured.get('draft_tokens_per_target_call_k4')} (held-out text), "
            f"{measured.get('draft_tokens_per_target_call_k4_chat')} (example chat prompts)"
        )
    return lines


def report_lines(record: dict[str, Any]) -> tuple[list[str], bool]:
    """Per-file comparison of a rebuild with the shipped hashes, and the figures; (lines, all reproduced)."""
    try:
        shipped = expected_files()
    except UserError:  # no hashes recorded yet: everything is new
        shipped = {}
    rows = compare(record, shipped)
    lines = []
    for row in rows:
        if row["identical"]:
            verdict = "identical"
        elif row["shipped"] is None:
            verdict = "new (not shipped)"
        elif row["rebuilt"] is None:
            verdict = "not rebuilt"
        else:
            verdict = f"DIFFERS (shipped {row['shipped'][:12]}…, rebuilt {row['rebuilt'][:12]}…)"
        lines.append(f"{row['path']}: {verdict}")
    reproduced = bool(rows) and all(r["identical"] for r in rows)
    m = record["measured"]
    if not shipped:
        lines.append("no shipped hashes to compare with (the preset lists no kit_model.files)")
    else:
        lines.append(
            f"rebuild {'REPRODUCED' if reproduced else 'did NOT reproduce'} the shipped hashes "
            f"({sum(r['identical'] for r in rows)} of {len(rows)} files identical)"
            + ("" if reproduced else "; other CPUs, Python versions (corpus) or torch versions may differ")
        )
    if "target_validation_loss" in m:
        lines.append(
            f"target: validation loss {m['target_validation_loss']}, mean top-1 probability "
            f"{m['target_mean_top1_prob']}; draft: {m['draft_tokens_per_target_call_k4']} tokens per target call "
            f"at k=4 (held-out text), {m['draft_tokens_per_target_call_k4_chat']} (example chat prompts)"
        )
    lines.append(
        f"steps: target {m['target_steps']} ({m['target_train_seconds']} s), draft {m['draft_steps']} "
        f"({m['draft_train_seconds']} s); build {m['build_seconds']} s; Python {m['python_version']}, "
        f"corpus {m['corpus_sha256'][:16]}…, torch {m['torch_version']}"
    )
    return lines, reproduced


@contextlib.contextmanager
def progress_display() -> Iterator[Any]:
    """A rich progress bar per training phase; yields the callback `build` takes."""
    console = Console(stderr=True)
    if not console.is_terminal:
        # Piped or under nohup: a line per tenth of each phase instead of a live bar.
        def line(phase: str, step: int, steps: int, loss: float) -> None:
            if step == steps or step % max(1, steps // 10) == 0:
                console.print(f"training {phase}: step {step}/{steps}, loss {loss:.3f}", highlight=False)

        yield line
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, step: int, steps: int, loss: float) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"training {phase}", total=steps, loss=loss)
            bar.update(tasks[phase], completed=step, loss=loss)

        yield update
