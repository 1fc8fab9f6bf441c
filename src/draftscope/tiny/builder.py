"""Building the tiny models from scratch: corpus → tokenizer → target → draft → bf16 files + a build record.

The work is fixed by step counts (never by the wall clock), the seeds are fixed and the kernels deterministic, so a
rebuild on the same machine, Python and torch reproduces every file bit for bit; `compare` says per file whether it
did. Other CPUs, Python versions (a different standard library, so a different corpus) or torch versions may differ.

The draft is trained on the text (plain cross-entropy), not distilled from the target. Distillation (KL to the
target's next-token distribution, `DRAFT_DISTIL_WEIGHT`) aims more directly at what speculative decoding rewards,
but every step then also runs the target and a full-vocabulary KL, ~3.5x the cost of a draft step; at an equal
~4 minutes on 2 cores the text-trained draft was clearly better (k=4, 64 new tokens: 2.30 vs 1.75 tokens per target
call on held-out stdlib text, 2.01 vs 1.51 on the example chat prompts; 750 text steps vs 200 distilled steps).
"""

from __future__ import annotations

import logging
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import atomic_write_json, read_json, sha256_file
from draftscope.core.outputs import check_output_path
from draftscope.core.resources import examples_dir
from draftscope.tiny import corpus as corpus_mod
from draftscope.tiny import models
from draftscope.tiny.assets import DRAFT_DIR, TARGET_DIR, _load_model, quiet_progress
from draftscope.tiny.preset_file import write_kit_model
from draftscope.tiny.tokenizer import ENDOFTEXT, save_tokenizer, special_token_ids, train_tokenizer, wrap

log = logging.getLogger("draftscope.tiny")

# Fixed work, chosen to take about 600 s (target: ~0.55 s per 32 x 128-token step) and 240 s (draft: ~0.16 s per
# step) on an otherwise idle 2-core CPU; the figures they reach are recorded in the preset (kit_model.measured).
TARGET_STEPS = 1000
DRAFT_STEPS = 1500
DRAFT_DISTIL_WEIGHT = 0.0  # > 0 distils from the target (see the module docstring)
SEED = 0
THREADS = 2
K = 4
HELDOUT_PROMPTS = 16
HELDOUT_PROMPT_TOKENS = 64
NEW_TOKENS = 64
RECORD_NAME = "build-record.json"  # written next to the files, never part of the hashed set
RECORD_SCHEMA = "draftscope.tiny-build/1"

Progress = Callable[[str, int, int, float], None]


def build(
    output_dir: Path,
    *,
    target_steps: int = TARGET_STEPS,
    draft_steps: int = DRAFT_STEPS,
    seed: int = SEED,
    threads: int = THREADS,
    measure: bool = True,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build tokenizer, target and draft into `output_dir` (new or empty) and return the build record.

    The record holds every file's SHA-256 (relative to `output_dir`), the settings, the measured figures and the
    seconds each phase took; it is also written to `output_dir/build-record.json`.
    """
    # lazy: tokenizers, torch and transformers, only when the models are built
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch", extra="local", image="transformers") from None
    from draftscope.tiny import train  # lazy: torch, only during a build

    for name, value in (("target_steps", target_steps), ("draft_steps", draft_steps), ("threads", threads)):
        if value < 1:
            raise UserError("must be at least 1", field=name, value=value)
    output_dir = _fresh_dir(Path(output_dir))
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def phase_done(name: str, since: float) -> float:
        seconds[name] = round(time.perf_counter() - since, 2)
        log.info("%s: %.1f s", name, seconds[name])
        return time.perf_counter()

    mark = time.perf_counter()
    corpus = corpus_mod.load_corpus()
    if not corpus.train or not corpus.validation:
        raise UserError("the standard library corpus is empty or has no held-out files", value=corpus.root)
    mark = phase_done("corpus", mark)

    raw_tokenizer = train_tokenizer(f.text for f in corpus.train)
    tokenizer = wrap(raw_tokenizer)
    save_tokenizer(tokenizer, output_dir)
    separator = special_token_ids(tokenizer)[ENDOFTEXT]
    train_stream = train.token_stream(raw_tokenizer, [f.text for f in corpus.train], separator)
    val_stream = train.token_stream(raw_tokenizer, [f.text for f in corpus.validation], separator)
    mark = phase_done("tokenizer", mark)

    target_settings = train.TrainSettings(steps=target_steps, seed=seed)
    draft_settings = train.TrainSettings(steps=draft_steps, seed=seed + 1, distil_weight=DRAFT_DISTIL_WEIGHT)
    with train.deterministic(threads):
        target = models.new_model(models.TARGET, seed=seed)
        train.train(target, train_stream, target_settings, phase="target", progress=progress)
        _save(target, output_dir / TARGET_DIR)
        mark = phase_done("target", mark)

        # A distilled draft learns from the target as shipped (bf16 weights), not from its fp32 training state.
        teacher = _reload(output_dir / TARGET_DIR) if DRAFT_DISTIL_WEIGHT > 0 else None
        draft = models.new_model(models.DRAFT, seed=seed + 1)
        train.train(draft, train_stream, draft_settings, teacher=teacher, phase="draft", progress=progress)
        _save(draft, output_dir / DRAFT_DIR)
        mark = phase_done("draft", mark)

    files = {
        p.relative_to(output_dir).as_posix(): sha256_file(p)
        for p in sorted(output_dir.rglob("*"))
        if p.is_file() and p.name != RECORD_NAME
    }
    measured: dict[str, Any] = {}
    if measure:
        with train.deterministic(threads):
            measured = _measure(output_dir, val_stream, tokenizer, threads)
        mark = phase_done("measure", mark)
    seconds["total"] = round(time.perf_counter() - started, 2)

    measured.update(
        {
            "target_parameters": models.parameter_count(target),
            "draft_parameters": models.parameter_count(draft),
            "target_steps": target_steps,
            "draft_steps": draft_steps,
            "tokens_per_step": target_settings.batch_size * target_settings.seq_len,
            "draft_training": (
                f"distilled from the target (KL weight {DRAFT_DISTIL_WEIGHT})"
                if DRAFT_DISTIL_WEIGHT > 0
                else "trained on the text (cross-entropy), not distilled"
            ),
            "train_tokens": train_stream.numel(),
            "validation_tokens": val_stream.numel(),
            "bytes_per_token": round(corpus.bytes / max(1, train_stream.numel() + val_stream.numel()), 3),
            "target_train_seconds": seconds["target"],
            "draft_train_seconds": seconds["draft"],
            "build_seconds": seconds["total"],
            "seed": seed,
            "threads": threads,
            "torch_version": str(torch.__version__),  # a str subclass that YAML cannot write
            "transformers_version": str(transformers.__version__),
            "tokenizers_version": str(tokenizers.__version__),
            "platform": platform.machine(),
            **corpus.summary(),
        }
    )
    record = {
        "schema": RECORD_SCHEMA,
        "settings": {
            "target": _settings_dict(target_settings),
            "draft": _settings_dict(draft_settings),
            "target_geometry": models.geometry_dict(models.TARGET),
            "draft_geometry": models.geometry_dict(models.DRAFT),
            "threads": threads,
        },
        "files": files,
        "measured": measured,
        "seconds": seconds,
    }
    atomic_write_json(output_dir / RECORD_NAME, record)
    return record


def compare(record: dict[str, Any], shipped: dict[str, str]) -> list[dict[str, Any]]:
    """Per file of either set: the shipped and rebuilt SHA-256 and whether they agree."""
    rebuilt = record["files"]
    return [
        {
            "path": path,
            "shipped": shipped.get(path),
            "rebuilt": rebuilt.get(path),
            "identical": shipped.get(path) is not None and shipped.get(path) == rebuilt.get(path),
        }
        for path in sorted(set(shipped) | set(rebuilt))
    ]


def install(output_dir: Path, record: dict[str, Any], *, assets: Path, preset_path: Path) -> None:
    """Copy a build's files over the shipped assets and record their hashes and figures in the preset."""
    output_dir = Path(output_dir)
    for rel, sha in record["files"].items():
        if sha256_file(output_dir / rel) != sha:
            raise UserError(f"{output_dir / rel} changed since it was built", fix="rebuild")
    if assets.exists():
        shutil.rmtree(assets)
    for rel in record["files"]:
        dest = assets / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(output_dir / rel, dest)
    write_kit_model(preset_path, files=record["files"], measured=record["measured"])


def _measure(folder: Path, val_stream: Any, tokenizer: Any, threads: int) -> dict[str, Any]:
    """Figures of the files as shipped (bf16 weights, computed in fp32)."""
    # lazy: torch, only during a build
    from draftscope.tiny import train

    target = _reload(folder / "target")
    draft = _reload(folder / "draft")
    target_eval = train.evaluate(target, val_stream)
    draft_eval = train.evaluate(draft, val_stream)
    heldout = train.heldout_prompts(val_stream, count=HELDOUT_PROMPTS, length=HELDOUT_PROMPT_TOKENS)
    chat_file = examples_dir() / "prompts.json"
    chat = read_json(chat_file, expect=dict)
    chat_prompts = [
        tokenizer.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        for p in chat["prompts"]
    ]
    chat_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in chat_prompts]
    # Batch-one decoding of models this small is per-call overhead: one thread is the faster choice.
    with train.deterministic(1):
        text_accept = train.tokens_per_target_call(target, draft, heldout, k=K, max_new_tokens=NEW_TOKENS)
        chat_accept = train.tokens_per_target_call(target, draft, chat_ids, k=K, max_new_tokens=NEW_TOKENS)
    return {
        "target_validation_loss": round(target_eval["loss"], 4),
        "target_perplexity": round(target_eval["perplexity"], 2),
        "target_mean_top1_prob": round(target_eval["mean_top1_prob"], 4),
        "target_top1_over_half": round(target_eval["top1_over_half"], 4),
        "draft_validation_loss": round(draft_eval["loss"], 4),
        "validation_positions": target_eval["positions"],
        "draft_tokens_per_target_call_k4": round(text_accept["tokens_per_target_call"], 3),
        "draft_tokens_per_target_call_k4_prompts": (
            f"{HELDOUT_PROMPTS} held-out stdlib windows of {HELDOUT_PROMPT_TOKENS} tokens, "
            f"{NEW_TOKENS} new tokens each, EOS ignored"
        ),
        "draft_tokens_per_target_call_k4_chat": round(chat_accept["tokens_per_target_call"], 3),
        "draft_tokens_per_target_call_k4_chat_prompts": (
            f"examples/prompts.json chat-templated ({len(chat_ids)} prompts, {NEW_TOKENS} new tokens, EOS ignored, "
            f"sha256 {sha256_file(chat_file)[:16]})"
        ),
    }


def _save(model: Any, folder: Path) -> None:
    # lazy: torch, only during a build
    import torch

    with quiet_progress():
        # Stored in bf16: half the bytes, and no measured figure changed (docs/develop/upstream-facts.md).
        model.to(torch.bfloat16).save_pretrained(str(folder))
    model.float()


def _reload(folder: Path) -> Any:
    return _load_model("", "cpu", "float32", folder)


def _fresh_dir(path: Path) -> Path:
    check_output_path(path, "--output", exists=True)  # an empty folder may be reused
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(
            "the build output folder exists and is not empty",
            value=str(path),
            fix="choose a new folder; a build never overwrites one",
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def _settings_dict(settings: Any) -> dict[str, Any]:
    return asdict(settings)
