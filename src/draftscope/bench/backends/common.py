"""Pieces every backend shares: dtype policy, lazy imports with an actionable error, prompt hashing and
encoding, and the refusals more than one backend's config checks raise."""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.hardware import dtype_for_capability
from draftscope.core.presets import ExperimentConfig


def need(module: str, *, extra: str | None = None, image: str | None = None) -> ModuleType:
    """Import a heavy module, or fail saying which extra or image provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(module, extra=extra, image=image) from None


def prompt_sha256(messages: Sequence[Mapping[str, Any]]) -> str:
    canonical = json.dumps(list(messages), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def chat_token_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """A prompt's token ids through the tokenizer's chat template, with the generation prompt appended."""
    # Read by attribute: BatchEncoding is not a dict subclass in transformers 5
    # (docs/develop/integration-bugs.md, bug 3).
    encoded = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    ids = getattr(encoded, "input_ids", encoded)
    return [int(i) for i in ids]


def choose_dtype(requested: str, device: str, capability: tuple[int, int] | None) -> str:
    """bf16 on NVIDIA capability >= 8.0, fp16 below; float32 on the CPU unless asked otherwise."""
    if requested != "auto":
        return requested
    if device == "cpu":
        return "float32"

    if capability is None:
        return "float16"
    return dtype_for_capability(*capability)


def decode_tok_s(times: Sequence[float]) -> float | None:
    """(generated − 1) / (t_last − t_first), or None when it cannot be measured."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


# --- refusals shared by the backends' config checks ---------------------------------------------------------


def head_used(config: ExperimentConfig) -> bool:
    """Whether the config asks for the certified head (a policy other than dense, its shadow, or a capture)."""
    head = config.head
    return head.policy != "dense" or head.shadow or bool(head.capture)


def head_refused(config: ExperimentConfig) -> UserError:
    return UserError(
        "the certified head runs in the kit's own speculative loop: Transformers backend with a draft",
        field="head.policy",
        value=config.head.policy,
        fix="add --backend transformers --draft …, or use --experimental-prefix for vLLM",
    )


def prefix_refused() -> UserError:
    return UserError(
        "the experimental prefix head runs only with --backend vllm --int4-dflash",
        field="experimental_prefix",
        value=True,
        fix="add --backend vllm --int4-dflash",
    )
