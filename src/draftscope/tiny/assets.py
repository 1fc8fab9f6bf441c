"""The shipped tiny models: where they are, whether they are the files the preset names, and loading them.

Loading always checks every file against its SHA-256 in `presets/models/tiny.yaml` (`kit_model.files`) first and
then goes through the real `from_pretrained` of a local folder with `local_files_only=True`, so nothing is ever
fetched from a hub. A mismatch is an error that names the file; the kit never rebuilds silently.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import sha256_file
from draftscope.core.presets import ModelPreset, load_model_preset

PRESET = "tiny"
TARGET_DIR = "target"
DRAFT_DIR = "draft"
# What a serving engine (vLLM) reads beside the weights: it loads the tokenizer and the chat template from the
# model folder itself, while the shipped layout keeps them once, beside `target/` and `draft/`.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
REBUILD_FIX = (
    "run `invoke tiny.build` to rebuild the tiny models and compare, then `invoke tiny.build --install` "
    "to replace the shipped files"
)

_ASSETS = Path(__file__).resolve().parent.parent / "assets" / "tiny"


def assets_dir() -> Path:
    """The folder the tiny models ship in (inside the package, so a wheel carries them)."""
    return _ASSETS


def expected_files(preset: ModelPreset | None = None) -> dict[str, str]:
    """Path (relative to the assets folder) → SHA-256, as the preset records them."""
    preset = preset or load_model_preset(PRESET)
    files = dict(preset.kit_model.files) if preset.kit_model else {}
    if not files:
        raise UserError(
            "the preset lists no tiny model files",
            source=preset.path or preset.name,
            field="kit_model.files",
            fix="run `invoke tiny.build --install`",
        )
    return files


def check_files(preset: ModelPreset | None = None, *, folder: Path | None = None) -> list[str]:
    """One line per file that is missing or differs from its recorded SHA-256; an empty list means all good."""
    folder = Path(folder) if folder is not None else assets_dir()
    problems = []
    for rel, expected in sorted(expected_files(preset).items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(f"{rel}: SHA-256 {actual[:16]}… differs from the recorded {expected[:16]}…")
    return problems


def require_files(preset: ModelPreset | None = None, *, folder: Path | None = None) -> None:
    """Raise a UserError naming every bad file, or return when all match."""
    preset = preset or load_model_preset(PRESET)
    problems = check_files(preset, folder=folder)
    if problems:
        where = Path(folder) if folder is not None else assets_dir()
        raise UserError(
            f"tiny model files in {where} do not match kit_model.files of {preset.path or preset.name}: "
            + "; ".join(problems),
            fix=REBUILD_FIX,
        )


def stage_for_vllm(dest: Path, which: str = "target") -> Path:
    """A folder a vLLM server loads as `--model`: the shipped tiny target (or draft) plus the tokenizer files.

    Every shipped file is checked against its recorded SHA-256 first. A file already in `dest` with the expected
    hash is kept (so a rerun or a second engine reuses the folder); one that differs is refused, never
    overwritten. Each copy lands under a temporary name and is renamed into place once its hash is checked, so a
    kill leaves no half-written weights behind. Returns `dest`.
    """
    subs = (TARGET_DIR, DRAFT_DIR)
    if which not in subs:
        raise UserError(
            "unknown tiny model", field="which", value=which, fix=f"use one of: {', '.join(subs)}"
        )
    preset = load_model_preset(PRESET)
    require_files(preset)
    expected = expected_files(preset)
    wanted = {rel: rel.split("/", 1)[1] for rel in expected if rel.startswith(f"{which}/")}
    wanted.update({name: name for name in TOKENIZER_FILES})
    missing = sorted(rel for rel in wanted if rel not in expected)
    if missing:
        raise UserError(
            f"the preset records no SHA-256 for {', '.join(missing)}",
            source=preset.path or preset.name,
            field="kit_model.files",
            fix="run `invoke tiny.build --install`",
        )
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UserError(
            "the vLLM model folder is not a directory",
            field="dest",
            value=str(dest),
            fix="name a new or existing folder",
        )
    dest.mkdir(parents=True, exist_ok=True)
    for rel, name in sorted(wanted.items()):
        _stage_file(assets_dir() / rel, dest / name, expected[rel])
    return dest


def _stage_file(source: Path, target: Path, sha: str) -> None:
    if target.exists():
        actual = sha256_file(target) if target.is_file() else "not a file"
        if actual != sha:
            raise UserError(
                f"{target} already exists and differs from the shipped {source.name} (SHA-256 {actual[:16]}…, "
                f"expected {sha[:16]}…)",
                field="dest",
                value=str(target.parent),
                fix="stage into a new folder, or remove the stale file yourself",
            )
        return
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.copyfile(source, partial)
    actual = sha256_file(partial)
    if actual != sha:
        partial.unlink()
        raise UserError(
            f"copying {source} to {target} gave SHA-256 {actual[:16]}…, expected {sha[:16]}…",
            fix="check the disk holding the destination, then stage again",
        )
    os.replace(partial, target)


def load_tokenizer(
    *, folder: Path | None = None, preset: ModelPreset | None = None, verify: bool = True
) -> Any:
    """The tiny tokenizer (chat template included) via `AutoTokenizer.from_pretrained`, offline."""
    folder = _checked(folder, preset, verify)
    # lazy: transformers, only when the tokenizer is loaded
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependency(exc.name or "transformers", extra="local", image="transformers") from None
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def load_target(
    device: str = "cpu",
    dtype: Any = "float32",
    *,
    folder: Path | None = None,
    preset: ModelPreset | None = None,
    verify: bool = True,
) -> Any:
    """The tiny target (`Qwen3ForCausalLM`) in eval mode; stored in bf16, float32 by default for CPU runs."""
    return _load_model(TARGET_DIR, device, dtype, _checked(folder, preset, verify))


def load_draft(
    device: str = "cpu",
    dtype: Any = "float32",
    *,
    folder: Path | None = None,
    preset: ModelPreset | None = None,
    verify: bool = True,
) -> Any:
    """The tiny draft (`Qwen3ForCausalLM`, same tokenizer) in eval mode."""
    return _load_model(DRAFT_DIR, device, dtype, _checked(folder, preset, verify))


def _checked(folder: Path | None, preset: ModelPreset | None, verify: bool) -> Path:
    if verify:
        require_files(preset, folder=folder)
    return Path(folder) if folder is not None else assets_dir()


def _load_model(sub: str, device: str, dtype: Any, folder: Path) -> Any:
    # lazy: torch and transformers, only when a model is loaded
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch", extra="local", image="transformers") from None
    if isinstance(dtype, str):
        if dtype == "auto":
            dtype = torch.bfloat16  # as stored
        elif isinstance(getattr(torch, dtype, None), torch.dtype):
            dtype = getattr(torch, dtype)
        else:
            raise UserError(
                "unknown dtype", field="dtype", value=dtype, fix="use float32, bfloat16 or float16"
            )
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(str(folder / sub), local_files_only=True, dtype=dtype)
    return model.to(device).eval()


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No transformers progress bars while loading or saving a one-shard model of a few MB."""
    # lazy: transformers, only around a load or a save
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
