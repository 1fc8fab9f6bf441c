"""The vLLM side of the semantic table: vLLM 0.33 serves a speculators checkpoint as it is (no conversion), through
its speculators adapter (`vllm/transformers_utils/configs/speculators/algos.py`: `update_dflash`, `update_dflash2`,
`update_dspark`, and `base.py`). Several of the fields it reads have a default that is not speculators' own:

- `sliding_window_non_causal`: vLLM sets `dflash_config.causal = not config.get("sliding_window_non_causal", True)`
  for every layer, so a DFlash checkpoint without the field would run bidirectional where speculators trained
  causal sliding layers; DSpark's adapter ignores the field (its layers then follow `layer_types`: sliding →
  causal), so a DSpark draft trained non-causal would be served causal;
- `sample_from_anchor`: vLLM's default is false, speculators' DSpark default true.

So the convert stage checks the checkpoint the way vLLM reads it too: every field vLLM reads is present where its
absence would change the model, and the per-layer causality vLLM resolves (`qwen3_dflash._dflash_layer_causal`,
mirrored here) equals the trained one. `tests/contract/test_sglang_draft_semantics.py` fails on any field the
pinned adapter reads that `READS` does not classify, and asserts the mirrored lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ALL = ("dflash", "dflash2", "dspark")


@dataclass(frozen=True)
class Read:
    kind: str  # explicit: must be in the checkpoint; same: absent means what speculators trained
    drafts: tuple[str, ...]
    why: str


READS: dict[str, Read] = {
    "speculators_model_type": Read("explicit", ALL, "selects the adapter and the speculative method"),
    "transformer_layer_config": Read("explicit", ALL, "the draft decoder's config"),
    "speculators_config": Read(
        "explicit", ALL, "proposal_methods[0].speculative_tokens: tokens drafted per step"
    ),
    "aux_hidden_state_layer_ids": Read("explicit", ALL, "the target layers feeding the draft (minus one)"),
    "mask_token_id": Read("explicit", ALL, "the id after the anchor"),
    "draft_vocab_size": Read(
        "explicit", ALL, "the draft vocabulary (the full one: the target's head is shared)"
    ),
    "sample_from_anchor": Read("explicit", ALL, "vLLM's default false; speculators' DSpark default true"),
    "sliding_window_non_causal": Read(
        "explicit",
        ("dflash", "dflash2"),
        "vLLM's default true (bidirectional); speculators' DFlash default false",
    ),
    "conv_kernel_size": Read("explicit", ("dflash2",), "absent: no convolution"),
    "conv_group_size": Read("explicit", ("dflash2",), "absent: no convolution"),
    "selector_rank": Read("explicit", ("dflash2",), "absent: no selector"),
    "selector_top_k": Read("explicit", ("dflash2",), "absent: no selector"),
    "block_size": Read("explicit", ("dspark",), "the DSpark block"),
    "markov_rank": Read("explicit", ("dspark",), "the Markov head"),
    "markov_head_type": Read("explicit", ("dspark",), "the Markov head"),
    "enable_confidence_head": Read("explicit", ("dspark",), "the confidence head"),
    "confidence_head_with_markov": Read("explicit", ("dspark",), "the confidence head's input"),
    "architectures": Read("same", ALL, "DSpark picks Qwen3DSparkModel from it (also the default)"),
    "target_hidden_size": Read("same", ALL, "absent or null: the draft's hidden size, as speculators trains"),
    "use_aux_hidden_state": Read(
        "same", ALL, "speculators never writes it; vLLM then uses the aux hidden states"
    ),
}


def vllm_causal_layers(config: Mapping[str, Any]) -> list[bool]:
    """Per layer, whether vLLM 0.33 attends causally: `is_causal`, else the adapter's `dflash_config.causal`
    (DFlash, DFlash2), else sliding layers causal and full ones not (`qwen3_dflash._dflash_layer_causal`)."""
    layer = config["transformer_layer_config"]
    layer_types = layer.get("layer_types")
    override = None
    if config.get("speculators_model_type") in ("dflash", "dflash2"):
        override = not config.get("sliding_window_non_causal", True)
    causal = []
    for i in range(int(layer["num_hidden_layers"])):
        if layer.get("is_causal") is not None:
            causal.append(bool(layer["is_causal"]))
        elif override is not None:
            causal.append(bool(override))
        else:
            causal.append(bool(layer_types) and layer_types[i] == "sliding_attention")
    return causal


def check(
    config: Mapping[str, Any], draft: str, trained_causal: list[bool], require: Callable[..., None]
) -> None:
    """The checkpoint as vLLM reads it: every explicit field present, and vLLM's causality the trained one."""
    for name, read in READS.items():
        if read.kind == "explicit" and draft in read.drafts:
            require(
                f"vllm:{name}",
                "present",
                "present" if name in config else "absent",
                ok=name in config,
                fix=f"vLLM reads it with a default ({read.why}): train with speculators 0.9.0, which writes it",
            )
    proposals = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    block, anchor = int(config.get("block_size") or 0), bool(config.get("sample_from_anchor"))
    require(
        "vllm:speculators_config.proposal_methods[0].speculative_tokens",
        block if anchor else block - 1,
        proposals[0].get("speculative_tokens"),
        fix="vLLM drafts this many tokens per step: block_size, less the anchor unless it samples",
    )
    require(
        "vllm:causality",
        trained_causal,
        vllm_causal_layers(config),
        fix="vLLM would attend otherwise than training: "
        + (
            "its DSpark adapter ignores sliding_window_non_causal; train DSpark without it"
            if draft == "dspark"
            else "its one dflash_config.causal covers every layer; train every layer sliding"
        ),
    )
