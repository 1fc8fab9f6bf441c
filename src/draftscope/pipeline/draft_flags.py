"""The draft's flags that train and convert write alike: the mask token, DFlash2's and DSpark's heads, and the
`--x`/`--no-x` switch. Train passes them to speculators' trainer; convert checks the checkpoint against the same
values, so the two cannot drift apart."""

from __future__ import annotations

from draftscope.core.presets import ModelPreset
from draftscope.pipeline.config import DFlash2Options, DSparkOptions


def bool_flag(name: str, value: bool) -> str:
    """`--NAME` or `--no-NAME`: a switch written out either way, so the argv alone says what was set."""
    return f"--{name}" if value else f"--no-{name}"


def mask_token_args(preset: ModelPreset) -> list[str]:
    """`--mask-token-id` when the preset names the mask token; nothing otherwise."""
    mask = preset.dflash.mask_token_id
    return [] if mask is None else ["--mask-token-id", str(mask)]


def dflash2_head_args(opts: DFlash2Options) -> list[str]:
    """DFlash2's local-convolution and selector heads."""
    return [
        "--conv-kernel-size",
        str(opts.conv_kernel_size),
        "--conv-group-size",
        str(opts.conv_group_size),
        "--selector-rank",
        str(opts.selector_rank),
        "--selector-top-k",
        str(opts.selector_top_k),
    ]


def dspark_head_args(opts: DSparkOptions) -> list[str]:
    """DSpark's Markov head and confidence head."""
    return [
        "--markov-rank",
        str(opts.markov_rank),
        "--markov-head-type",
        opts.markov_head_type,
        bool_flag("enable-confidence-head", opts.enable_confidence_head),
        bool_flag("confidence-head-with-markov", opts.confidence_head_with_markov),
    ]
