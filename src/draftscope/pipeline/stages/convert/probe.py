"""The mask probe: the attention mask a draft was trained under, against the mask SGLang builds from the converted
config, for every layer, on the CPU, before anything is served. A difference refuses the conversion.

The training side is speculators' own code: the checkpoint's model class (from speculators' registry, built on the
meta device: no weights are needed) and its `_build_attention_mask`, made dense with torch's `create_mask`, one
anchor at a time; each layer takes the sliding mask when speculators lists it in `sliding_window_indices`.

The serving side is this module's small re-implementation of SGLang 0.5.23's rules (the contract test
`tests/contract/test_sglang_draft_semantics.py` asserts every mirrored line still reads so in the pinned source):
- the config is loaded as SGLang loads it, through transformers' class for its `model_type` (Qwen3Config keeps
  `sliding_window` only with `use_sliding_window`);
- per layer (`models/dflash.py`, `_get_dflash_layer_attention_params`): no `layer_types` → full and bidirectional;
  `full_attention` → bidirectional unless `is_causal` is true; `sliding_attention` → causal unless `is_causal` is
  false, with `window_left = sliding_window - 1` (`dflash_utils.get_dflash_attention_sliding_window_size`);
- the draft's keys are the context (positions < p, the target's hidden states) and its block (p … p+B-1, the
  anchor first); FlashAttention's window (`flashattention_backend.py`): key k is visible to query q when
  `q - window_left <= k`, and `k <= q` on a causal layer (`k <= q + window_left` on a bidirectional sliding one).

Contexts probed: the first few, both sides of every window edge, and the longest context served. Before that, every
field of the semantic table must read back unchanged from the config object transformers builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.pipeline.stages.convert import semantics


@dataclass(frozen=True)
class LayerRule:
    """How SGLang attends in one draft layer."""

    kind: str  # full_attention | sliding_attention
    causal: bool
    window_left: int  # -1: no window


# SGLang 0.5.23 pins transformers==5.19.0 (the contract test reads its metadata); config classes normalise fields
# differently across releases (5.24's Qwen3Config drops a top-level partial_rotary_factor, 5.19's keeps it).
SGLANG_TRANSFORMERS = "5.19.0"


def _load(config: Mapping[str, Any]) -> Any:
    """The config object SGLang's loader would hand the draft class (transformers' class for the model type)."""
    import transformers
    from transformers import CONFIG_MAPPING

    if transformers.__version__ != SGLANG_TRANSFORMERS:
        raise UserError(
            f"the probe loads the config as SGLang does, with transformers {SGLANG_TRANSFORMERS}; this environment "
            f"has {transformers.__version__}",
            field="transformers",
            fix="run convert in the train image (its lock pins transformers 5.19.0)",
        )

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise UserError(f"transformers has no config class for {model_type!r}", field="model_type")
    return CONFIG_MAPPING[model_type].from_dict(dict(config))


def check_loaded(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every top-level field of the semantic table reads back unchanged from the config object transformers builds
    (a class that normalises a field, as Qwen3Config drops sliding_window without use_sliding_window, would
    otherwise change what SGLang sees)."""
    loaded = _load(config)
    for name, value in config.items():
        if name in semantics.BY_NAME and getattr(loaded, name, None) != value:
            raise UserError(
                f"written {value!r}, but {type(loaded).__name__} gives SGLang {getattr(loaded, name, None)!r}",
                field=f"transformers:{name}",
                fix="write the field in the form the config class keeps (see semantics.py)",
            )
    fields = sorted(n for n in config if n in semantics.BY_NAME)
    return {
        "field": "probe:config",
        "expected": "read back unchanged",
        "found": f"{len(fields)} fields",
        "ok": True,
    }


def sglang_layers(config: Mapping[str, Any]) -> list[LayerRule]:
    """SGLang's attention type and window for every draft layer of a converted config."""
    loaded = _load(config)
    text = getattr(loaded, "text_config", None) or loaded
    layers = int(text.num_hidden_layers)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is None:
        return [LayerRule("full_attention", False, -1)] * layers
    is_causal = getattr(text, "is_causal", None)
    rules = []
    for i in range(layers):
        kind = layer_types[i]
        if kind == "full_attention":
            rules.append(LayerRule(kind, bool(is_causal) if is_causal is not None else False, -1))
        elif kind == "sliding_attention":
            window = getattr(text, "sliding_window", None)
            if window is None:
                raise UserError(
                    "a sliding layer without a window: SGLang refuses it",
                    field="sliding_window",
                    fix="write sliding_window and use_sliding_window: true",
                )
            rules.append(LayerRule(kind, bool(is_causal) if is_causal is not None else True, int(window) - 1))
        else:
            raise UserError(f"SGLang has no draft layer type {kind!r}", field=f"layer_types[{i}]")
    return rules


def sglang_mask(torch: Any, rule: LayerRule, context: int, block: int, total: int) -> Any:
    """[block, total + block] booleans laid out as speculators' one-anchor mask: the base sequence (`total`
    positions, the context first), then the block."""
    q = torch.arange(block).unsqueeze(1) + context
    k = torch.cat([torch.arange(total), torch.arange(block) + context]).unsqueeze(0)
    is_context = torch.cat([torch.arange(total) < context, torch.ones(block, dtype=torch.bool)]).unsqueeze(0)
    visible = is_context & (~torch.tensor(rule.causal) | (k <= q))
    if rule.window_left >= 0:
        visible &= k >= q - rule.window_left
        if not rule.causal:
            visible &= k <= q + rule.window_left
    return visible


def contexts(block: int, windows: set[int], max_context: int) -> list[int]:
    """Anchor positions p (= context lengths) to probe: the first few, both sides of every window edge
    (where the two windows can part: p = W - B + 1 and p = W), and the longest context served."""
    points = {0, 1, 2, block - 1, block, block + 1, max_context - 1}
    for w in windows:
        points |= {w - block, w - block + 1, w - 1, w, w + 1}
    return sorted(p for p in points if 0 <= p < max_context)


def speculators_model(checkpoint: Path) -> Any:
    """The checkpoint's speculators model class, built on the meta device from its config."""
    import torch
    from speculators import SpeculatorModel, SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(checkpoint))
    cls = SpeculatorModel.registered_model_class_from_config(config)
    with torch.device("meta"):
        return cls(config)


def speculators_mask(model: Any, context: int) -> tuple[Any, Any]:
    """speculators' (full, sliding) masks for one anchor at position `context`, dense on the CPU: each
    [block, context + block + 1 + block] (the base sequence, then the block); None where no layer uses it."""
    import torch
    from torch.nn.attention.flex_attention import create_mask

    block = int(model.block_size)
    total = context + block + 1  # speculators never anchors in the last block_size positions
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, context] = 1
    model._create_mask_fn = create_mask  # dense booleans instead of its block-sparse form
    full, sliding, anchors, valid = model._build_attention_mask(
        loss_mask, 1, torch.zeros(1, total, dtype=torch.long), torch.device("cpu")
    )
    assert anchors.tolist() == [context] and valid.tolist() == [True]
    return tuple(None if m is None else m[0, 0].bool() for m in (full, sliding))  # type: ignore[return-value]


def _describe(p: int, i: int, col: int, total: int) -> str:
    key = f"context position {col}" if col < total else f"block position {col - total}"
    return f"context {p}, block query {i}, {key}"


def run(
    checkpoint: Path, written: Mapping[str, Any], *, max_context: int | None = None
) -> list[dict[str, Any]]:
    """Compare every layer's masks over the probed contexts; one row per layer, or a refusal naming the layer,
    the first differing query and key, both values and the fix."""
    import torch

    loaded = check_loaded(written)
    model = speculators_model(checkpoint)
    rules = sglang_layers(written)
    block = int(model.block_size)
    sliding = set(model.sliding_window_indices)
    trained_window = int(model.sliding_window) if sliding else None
    if len(rules) != len(model.layers):
        raise UserError(
            f"SGLang builds {len(rules)} layers, speculators {len(model.layers)}", field="num_hidden_layers"
        )
    limit = int(max_context or written.get("max_position_embeddings") or 0)
    if limit <= block:
        raise UserError(f"the longest context served ({limit}) must exceed the block", field="max_context")
    windows = {r.window_left + 1 for r in rules if r.window_left >= 0} | (
        {trained_window} if trained_window else set()
    )
    probed = contexts(block, windows, limit)
    for p in probed:
        full, slide = speculators_mask(model, p)
        total = p + block + 1
        for layer, rule in enumerate(rules):
            trained = slide if layer in sliding else full
            served = sglang_mask(torch, rule, p, block, total)
            differ = (trained != served).nonzero()
            if len(differ):
                i, col = (int(x) for x in differ[0])
                raise UserError(
                    f"{_describe(p, i, col, total)}: trained {bool(trained[i, col])}, SGLang computes "
                    f"{bool(served[i, col])} ({rule.kind}, causal={rule.causal}, window_left={rule.window_left}; "
                    f"trained {'sliding' if layer in sliding else 'full'}, "
                    f"sliding_window_non_causal={model.sliding_window_non_causal}, window={trained_window})",
                    field=f"probe:layer{layer}",
                    fix=_fix(col < total, rule, trained_window, block, limit),
                )
    return [loaded] + [
        {
            "field": f"probe:layer{layer}",
            "expected": "speculators' training mask",
            "found": f"SGLang's mask equal at {len(probed)} contexts in [0, {limit})",
            "ok": True,
        }
        for layer in range(len(rules))
    ]


def _fix(context_key: bool, rule: LayerRule, window: int | None, block: int, limit: int) -> str:
    if context_key and window:
        return (
            "SGLang's window counts back from each query, speculators' from the anchor: train with "
            f"train.sliding_window >= {limit + block - 1}, or serve with serve.context_length <= {window - block + 1}"
        )
    return "write is_causal, layer_types and sliding_window as trained (see semantics.py)"
