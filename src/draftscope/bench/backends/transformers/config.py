"""The Transformers backend's config rules: what it runs (the kit's own loop, with or without a draft, on the GPU or
the CPU) and what it refuses, checked when a benchmark is planned."""

from __future__ import annotations

from draftscope.bench.backends.common import head_refused, head_used, prefix_refused
from draftscope.core.errors import UserError
from draftscope.core.presets import ExperimentConfig

DEVICES = ("cuda", "cpu")


def check(config: ExperimentConfig) -> None:
    # The certified head replaces the target head inside the kit's speculative loop: it needs a draft to verify.
    if head_used(config) and config.draft is None:
        raise head_refused(config)
    if config.int4_dflash:
        raise UserError(
            "int4_dflash needs the vLLM backend",
            field="int4_dflash",
            value=True,
            fix="add --backend vllm or drop --int4-dflash",
        )
    if config.experimental_prefix:
        raise prefix_refused()
