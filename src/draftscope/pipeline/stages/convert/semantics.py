"""What a converted draft *means* to SGLang: every config field by which SGLang 0.5.23's draft classes decide
behaviour, paired with the speculators training option or config field that determines it.

Reading SGLang's source (`models/dflash.py`, `models/dspark.py`, `speculative/dflash_utils.py`,
`speculative/dspark_components/dspark_config.py`) shows defaults that silently change the model when a field is
absent: a `sliding_attention` layer is causal unless `is_causal` says otherwise (speculators trains DFlash2's
sliding layers non-causal); the mask token string falls back to `<|MASK|>`; `sample_from_anchor` to true; a
missing `conv_*`/`selector_*` to "no head". So each field is one of:

- `written`: convert writes it explicitly, derived from the training config, and the check compares it;
- `copied`: the decoder's own field, copied from `transformer_layer_config`; it must be there and equal;
- `absent`: must not be written — its presence sends SGLang down a path speculators never trains (a nested
  `text_config`, the bundled-draft `dspark_*` keys, a quantization config, the Nemotron-3.5 detection keys);
- `unread`: read only behind a condition the written fields rule out (named in `decides`).

`tests/contract/test_sglang_draft_semantics.py` walks the pinned SGLang source with `ast` and fails on any config
attribute the draft classes read that this table does not classify. Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json

DRAFTS = ("dflash", "dflash2", "dspark")
TOP, NESTED = "top", "dflash_config"
# speculators' fallback when the target's tokenizer has no mask token (speculators.train.utils).
SPECULATORS_MASK_TOKEN = "<|MASK|>"


@dataclass(frozen=True)
class Trained:
    """The training side: the speculators checkpoint config and what convert resolved beside it."""

    draft: str
    config: Mapping[str, Any]
    architecture: str
    num_target_layers: int
    block_size: int  # what SGLang's block_size means for this draft (DSpark: gamma)
    mask_token: str

    @property
    def layer(self) -> Mapping[str, Any]:
        return self.config["transformer_layer_config"]

    def layer_types(self) -> list[str]:
        return layer_types(self.config)

    def causal_layers(self) -> list[bool]:
        return causal_layers(self.config)


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """speculators' per-layer kinds; without `layer_types` every layer is full attention (its DFlash model)."""
    layer = config["transformer_layer_config"]
    found = layer.get("layer_types")
    return list(found) if found else ["full_attention"] * int(layer["num_hidden_layers"])


def causal_layers(config: Mapping[str, Any]) -> list[bool]:
    """speculators' `create_anchor_block_mask_mod`: full attention is always non-causal; a sliding layer is causal
    inside its block unless trained with `sliding_window_non_causal`."""
    non_causal = bool(config.get("sliding_window_non_causal"))
    return [kind == "sliding_attention" and not non_causal for kind in layer_types(config)]


def _is_causal(t: Trained) -> bool:
    causal = set(t.causal_layers())
    if len(causal) != 1:
        raise UserError(
            f"layers mix causal and non-causal attention ({t.layer_types()}, sliding_window_non_causal="
            f"{t.config.get('sliding_window_non_causal')}); SGLang's one is_causal cannot say that explicitly",
            field="is_causal",
            fix="train with every draft layer sliding (no --full-attention-indices) or with "
            "--sliding-window-non-causal",
        )
    return causal.pop()


def _copied(name: str) -> Callable[[Trained], Any]:
    def value(t: Trained) -> Any:
        if name not in t.layer:
            raise UserError(
                "missing from transformer_layer_config: SGLang would use its own default",
                field=f"transformer_layer_config.{name}",
                fix="convert a checkpoint written by speculators 0.9.0 (its Qwen3 config carries the field)",
            )
        return t.layer[name]

    return value


def _dspark(name: str) -> Callable[[Trained], Any]:
    return lambda t: t.config[name]


def _conv(name: str) -> Callable[[Trained], Any]:
    return lambda t: int(t.config[name]) if t.draft == "dflash2" else 0


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # written | copied | absent | unread
    decides: str  # what SGLang decides by it
    source: str  # the speculators option or config field that determines it
    at: tuple[str, ...] = (TOP,)
    drafts: tuple[str, ...] = DRAFTS
    value: Callable[[Trained], Any] | None = None
    via: str = "sglang"  # "transformers": read by the Qwen3Config SGLang loads the file with


def _w(name, value, decides, source, at=(TOP,), drafts=DRAFTS, kind="written", via="sglang") -> Field:
    return Field(name, kind, decides, source, at=at, drafts=drafts, value=value, via=via)


BOTH = (TOP, NESTED)
DFLASH2_HEADS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
GEOMETRY = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "hidden_act",
    "rms_norm_eps",
    "attention_bias",
    "max_position_embeddings",
    "vocab_size",
    "rope_parameters",
)
# Never written: each sends SGLang down a path speculators never trains.
ABSENT = {
    "text_config": "a nested config every text-config read would take instead",
    "dspark_config": "DSpark fields overriding dflash_config",
    "dspark_block_size": "a bundled DSpark head's key, overriding block_size",
    "dspark_markov_rank": "a bundled DSpark head's key, overriding markov_rank",
    "dspark_markov_head_type": "a bundled DSpark head's key, overriding markov_head_type",
    "dspark_noise_token_id": "a bundled DSpark head's key",
    "dspark_target_layer_ids": "a bundled DSpark head's key, overriding target_layer_ids",
    "quantization_config": "a quantized draft (and the Nemotron-3.5 detection)",
    "eagle_aux_hidden_state_layer_ids": "the Nemotron-3.5 draft detection",
    "swa_window_size": "the Nemotron-3.5 window",
}
# Read only behind a condition the written fields rule out.
UNREAD = {
    "shift_label": "Domino only (projector_type == 'domino')",
    "pure_draft_prefix_len": "Domino only (projector_type == 'domino')",
    "gru_hidden_dim": "Domino only (projector_type == 'domino')",
    "emb_dim": "Domino only (projector_type == 'domino')",
    "swiglu_alpha": "only when hidden_act == 'swigluoai'",
    "swiglu_limit": "only when hidden_act == 'swigluoai'",
    "quant_algo": "read from quantization_config only (absent)",
    "is_neox_style": "superseded by rope_is_neox_style (written)",
    "rope_theta": "superseded by rope_parameters['rope_theta'] (copied)",
    "rope_scaling": "superseded by rope_parameters (copied)",
}

FIELDS: tuple[Field, ...] = (
    # what the draft is and how its layers attend
    _w("architectures", lambda t: [t.architecture], "the model class", "speculators_model_type"),
    _w(
        "is_causal",
        _is_causal,
        "causality of every layer (absent: sliding layers causal, full layers bidirectional)",
        "--sliding-window-non-causal, --full-attention-indices",
    ),
    _w(
        "layer_types",
        Trained.layer_types,
        "sliding vs full layers (absent: all full)",
        "--full-attention-indices",
    ),
    _w(
        "sliding_window",
        lambda t: t.layer.get("sliding_window"),
        "the window (SGLang: - 1)",
        "--sliding-window",
    ),
    _w(
        "use_sliding_window",
        lambda t: "sliding_attention" in t.layer_types(),
        "Qwen3Config keeps sliding_window",
        "layer_types",
        via="transformers",
    ),
    # the block, the anchor, the mask token, the target layers
    _w("block_size", lambda t: t.block_size, "the block (DSpark: gamma)", "--block-size", at=BOTH),
    _w(
        "sample_from_anchor",
        lambda t: bool(t.config["sample_from_anchor"]),
        "the anchor row is sampled (DSpark default: true)",
        "--sample-from-anchor",
        at=BOTH,
    ),
    _w(
        "mask_token_id",
        lambda t: int(t.config["mask_token_id"]),
        "the id after the anchor",
        "--mask-token-id",
        at=BOTH,
    ),
    _w(
        "mask_token",
        lambda t: t.mask_token,
        "the string checked against the target's vocabulary (default '<|MASK|>')",
        "the target tokenizer's token for mask_token_id",
        at=(NESTED,),
    ),
    _w(
        "target_layer_ids",
        lambda t: [i - 1 for i in t.config["aux_hidden_state_layer_ids"]],
        "the target layers feeding the draft",
        "aux_hidden_state_layer_ids - 1 (--target-layer-ids)",
        at=(NESTED,),
    ),
    _w("num_target_layers", lambda t: t.num_target_layers, "the target's depth", "the verifier", at=BOTH),
    _w(
        "projector_type",
        lambda t: "dspark" if t.draft == "dspark" else None,
        "the context projector (domino: another layout)",
        "the draft type",
        at=(NESTED,),
    ),
    # heads: DFlash2's (0 = none, what DFlash and DSpark train), DSpark's, and none of the other vendors'
    *(
        _w(k, _conv(k), f"DFlash2's {k} (0: none)", f"--{k.replace('_', '-')}", at=(NESTED,))
        for k in DFLASH2_HEADS
    ),
    _w("output_multiplier", lambda t: 1.0, "draft logit scale", "none in speculators", at=(NESTED,)),
    _w("final_logit_softcapping", lambda t: 0.0, "draft logit soft cap", "none in speculators", at=(NESTED,)),
    _w("attention_value_scale", lambda t: None, "a V scale", "none in speculators", at=(NESTED,)),
    _w("attention_sink_bias", lambda t: False, "per-head attention sinks", "none in speculators", at=BOTH),
    _w(
        "markov_rank",
        _dspark("markov_rank"),
        "the Markov head (0: refused)",
        "--markov-rank",
        BOTH,
        ("dspark",),
    ),
    _w(
        "markov_head_type",
        _dspark("markov_head_type"),
        "the Markov head",
        "--markov-head-type",
        (NESTED,),
        ("dspark",),
    ),
    _w(
        "enable_confidence_head",
        _dspark("enable_confidence_head"),
        "a confidence head",
        "--enable-confidence-head",
        drafts=("dspark",),
    ),
    _w(
        "confidence_head_with_markov",
        _dspark("confidence_head_with_markov"),
        "the confidence head's input (default: markov_rank > 0)",
        "--confidence-head-with-markov",
        drafts=("dspark",),
    ),
    # norms, rotary, embedding and head sharing, decoder geometry
    _w("use_gemma_norm", lambda t: False, "x*w vs x*(1+w) norms", "speculators' Qwen3RMSNorm layers"),
    _w("rope_is_neox_style", lambda t: True, "the rotary layout", "Qwen3's rotary (rotate_half)"),
    _w(
        "partial_rotary_factor",
        lambda t: float(t.layer.get("partial_rotary_factor", 1.0)),
        "rotated share of head_dim",
        "transformer_layer_config (Qwen3: 1.0)",
    ),
    _w("has_embed_tokens", lambda t: False, "the target's embedding is shared", "no embed_tokens is saved"),
    _w(
        "has_lm_head",
        lambda t: False,
        "the target's LM head is shared",
        "full vocabulary: no lm_head is saved",
    ),
    *(
        _w(k, _copied(k), "decoder geometry", f"transformer_layer_config.{k}", kind="copied")
        for k in GEOMETRY
    ),
    _w("dflash_config", None, "the nested draft config (read before the top level)", "written by convert"),
    *(Field(k, "absent", why, "-") for k, why in ABSENT.items()),
    *(Field(k, "unread", why, "-") for k, why in UNREAD.items()),
)

BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}


def applicable(draft: str) -> list[Field]:
    return [
        f for f in FIELDS if draft in f.drafts and f.value is not None and f.kind in ("written", "copied")
    ]


def resolve_mask_token(vocab: Mapping[str, int] | None, mask_token_id: int) -> str:
    """SGLang's mask token string for `mask_token_id`: the target tokenizer's token with that id, else
    speculators' own fallback string (which must then not be another token of the vocabulary)."""
    if vocab is None:
        raise UserError(
            "the target's tokenizer is needed to name the mask token",
            field="mask_token",
            fix="pass --tokenizer <the target's tokenizer folder, with tokenizer.json>",
        )
    named = [token for token, i in vocab.items() if i == mask_token_id]
    if len(named) == 1:
        return named[0]
    taken = vocab.get(SPECULATORS_MASK_TOKEN)
    if named or taken not in (None, mask_token_id):
        raise UserError(
            f"the target vocabulary maps {named or [SPECULATORS_MASK_TOKEN]} to "
            f"{[mask_token_id] if named else [taken]}; SGLang would refuse to start or use another id",
            field="mask_token",
            fix="train with --mask-token-id set to the id of one mask token of the target's tokenizer",
        )
    return SPECULATORS_MASK_TOKEN


def read_vocab(model: Path) -> dict[str, int]:
    """The target tokenizer's vocabulary (token → id, added tokens included), as `get_vocab()` gives it, read
    from `tokenizer.json` without the tokenizers library."""
    path = model / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            "no tokenizer.json in the target's tokenizer folder", source=str(model), field="mask_token"
        )
    data = read_json(path, expect=dict)
    found = (data.get("model") or {}).get("vocab") or {}
    vocab = dict(found) if isinstance(found, dict) else {entry[0]: i for i, entry in enumerate(found)}
    vocab.update({added["content"]: int(added["id"]) for added in data.get("added_tokens") or []})
    return vocab


def write(out: dict[str, Any], t: Trained) -> None:
    """Every applicable field, explicitly, where SGLang reads it."""
    nested = out.setdefault(NESTED, {})
    for f in applicable(t.draft):
        value = f.value(t)  # type: ignore[misc]
        for where in f.at:
            (out if where == TOP else nested)[f.name] = value


def check(written: Mapping[str, Any], t: Trained, require: Callable[..., None]) -> None:
    """Compare every field of the written config with the training side (`require(field, expected, found,
    fix=..., ok=...)`, as convert's `Checks.require`)."""
    nested = written.get(NESTED) or {}
    for f in applicable(t.draft):
        want = f.value(t)  # type: ignore[misc]
        for where in f.at:
            scope = written if where == TOP else nested
            name = f.name if where == TOP else f"{NESTED}.{f.name}"
            if f.name not in scope:
                require(
                    name,
                    want,
                    "absent",
                    ok=False,
                    fix=f"write {f.name} = {want!r} ({f.source}); SGLang's default would decide {f.decides}",
                )
            require(name, want, scope[f.name], fix=f"it must follow {f.source}: {f.decides}")
    for f in FIELDS:
        if f.kind == "absent":
            found = [where for where, scope in ((TOP, written), (NESTED, nested)) if f.name in scope]
            require(
                f.name,
                "absent",
                f"present ({', '.join(found)})" if found else "absent",
                ok=not found,
                fix=f"drop it: {f.decides}",
            )


def names(kinds: Sequence[str] = ("written", "copied", "absent", "unread")) -> set[str]:
    return {f.name for f in FIELDS if f.kind in kinds}
