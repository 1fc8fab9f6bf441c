"""convert in the container: a speculators checkpoint → a draft folder SGLang serves, every contract applied and checked.

speculators has no exporter to SGLang (its `convert` goes the other way), and the mistakes here load cleanly and
collapse acceptance to about one token, so each rule is a check that refuses inconsistent input naming the field:

- `architectures`: DFlashDraftModel (dflash), DFlash2DraftModel (dflash2), Qwen3DSparkModel (dspark).
- `transformer_layer_config` is flattened to the top level (SGLang builds the draft's Qwen3 layers from it).
- `dflash_config.target_layer_ids = [i - 1 for i in aux_hidden_state_layer_ids]`: speculators counts hidden states
  from the embeddings, SGLang counts layers and adds one when capturing. They must equal the preset's layer ids;
  `num_target_layers` is the target's layer count.
- `block_size` and `mask_token_id` are copied (and must match the preset); DFlash2's `conv_kernel_size`,
  `conv_group_size`, `selector_rank`, `selector_top_k`; DSpark's `markov_rank`, `markov_head_type`,
  `enable_confidence_head`, `confidence_head_with_markov` (SGLang reads the confidence-head fields at the top
  level, the rest from `dflash_config`: both are written).
- `sample_from_anchor`: SGLang's DFLASH worker treats the anchor as the bonus token ("1 + N"), so a DFlash or DFlash2
  checkpoint trained otherwise is refused. SGLang's DSPARK reads the flag (default *true* when absent) and
  counts its block as gamma = drafted tokens: convert writes the flag explicitly and gamma = block_size when the
  anchor samples, block_size - 1 when it does not.
- The draft's full vocabulary, hidden size and layer count match the target and the preset; the weights file
  carries the modules SGLang loads (`fc`, `hidden_norm`, `norm`, every layer).

- Every field by which SGLang's draft classes decide what they compute (causality, window, mask token string,
  heads, norms, rotary, embedding and head sharing, geometry) is written explicitly from the training config by
  the semantic table (`semantics.py`), never left to SGLang's default, and compared after the re-read.

The checkpoint is also checked the way vLLM reads it (`vllm_semantics.py`: vLLM serves it unconverted). The
output is re-read and checked the way SGLang reads it (`sglang_view`, `semantics.check`); the in-container entry
(`entry.py`) then runs the mask probe (`probe.py`: torch and speculators, in the train image) before the folder is
final, and describes it in `draft/draftscope-convert.json` (schema `stage-convert`). This module itself: no torch.

Over ~400 lines on purpose: every rule of the conversion sits beside the check that enforces it, so the whole
contract with SGLang reads in one place.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, open_regular, parse_json, read_json, sha256_file
from draftscope.core.schema import check
from draftscope.pipeline.stages.convert import semantics, vllm_semantics

REPORT = "draftscope-convert.json"
WEIGHTS = "model.safetensors"

ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel", "dspark": "Qwen3DSparkModel"}
# What the SGLang draft config carries besides the flattened layer config (each key is checked against SGLang's
# released source by tests/contract/test_sglang_pipeline.py).
DFLASH_CONFIG_KEYS = ("target_layer_ids", "num_target_layers", "block_size", "mask_token_id")
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
DSPARK_KEYS = ("markov_rank", "markov_head_type")
DSPARK_TOP_LEVEL_KEYS = (
    "enable_confidence_head",
    "confidence_head_with_markov",
    "markov_rank",
    "sample_from_anchor",
)
# speculators-only keys that do not belong in the SGLang config.
SPECULATORS_KEYS = (
    "speculators_model_type",
    "speculators_config",
    "speculators_version",
    "transformer_layer_config",
    "aux_hidden_state_layer_ids",
    "draft_vocab_size",
    "auto_map",
)


# --- the contracts --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What the checkpoint must agree with: the preset's geometry and the configured draft options."""

    draft: str
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    num_draft_layers: int
    block_size: int
    vocab_size: int
    mask_token_id: int | None = None
    hidden_size: int | None = None
    dflash2: Mapping[str, int] = field(default_factory=dict)
    dspark: Mapping[str, Any] = field(default_factory=dict)
    vocab: Mapping[str, int] | None = None  # the target tokenizer's (token → id): names the mask token


@dataclass
class Checks:
    source: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def require(
        self, name: str, expected: Any, found: Any, fix: str | None = None, ok: bool | None = None
    ) -> None:
        passed = (expected == found) if ok is None else ok
        self.rows.append({"field": name, "expected": _plain(expected), "found": _plain(found), "ok": passed})
        if not passed:
            raise UserError(
                f"expected {_plain(expected)!r}, found {_plain(found)!r}",
                source=self.source,
                field=name,
                fix=fix,
            )


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def dspark_gamma(block_size: int, sample_from_anchor: bool) -> int:
    """SGLang's DSpark gamma (drafted tokens per step) for a speculators block: every block position drafts when
    the anchor samples, all but the anchor otherwise."""
    return block_size if sample_from_anchor else block_size - 1


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.exists():
        raise UserError("no config.json in the checkpoint folder", source=str(folder))
    return read_json(path, expect=dict)


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor table of a safetensors file (name → dtype, shape, offsets), read without torch: an 8-byte
    little-endian length, then that many bytes of JSON."""
    if not path.exists():
        raise UserError("the weights file is missing", source=str(path))
    try:
        with open_regular(path) as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > 100 * 1024 * 1024:
                raise UserError("implausible safetensors header length", source=str(path))
            data = fh.read(length)
    except struct.error as exc:
        raise UserError(f"not a safetensors file ({exc})", source=str(path)) from None
    if len(data) < length:
        raise UserError("not a safetensors file (its header is cut short)", source=str(path))
    header = parse_json(data, str(path), expect=dict)
    header.pop("__metadata__", None)
    return header


def check_checkpoint(
    config: Mapping[str, Any], tensors: Mapping[str, Any], expected: Expected, source: str
) -> Checks:
    """Every contract on the speculators checkpoint; raises on the first violation, naming the field."""
    c = Checks(source)
    c.require(
        "speculators_model_type",
        expected.draft,
        config.get("speculators_model_type"),
        fix=f"convert a {expected.draft} checkpoint, or run the pipeline with --draft "
        f"{config.get('speculators_model_type')}",
    )
    layer = config.get("transformer_layer_config")
    c.require(
        "transformer_layer_config",
        "a mapping",
        type(layer).__name__,
        ok=isinstance(layer, dict),
        fix="a speculators checkpoint nests the draft's decoder config under transformer_layer_config",
    )
    assert isinstance(layer, dict)
    c.require(
        "transformer_layer_config.model_type",
        "qwen3",
        layer.get("model_type", "qwen3"),
        fix="SGLang's DFlash-family drafts are Qwen3 decoder layers (speculators --draft-arch qwen3)",
    )
    c.require(
        "transformer_layer_config.num_hidden_layers",
        expected.num_draft_layers,
        layer.get("num_hidden_layers"),
        fix="the preset's dflash.num_draft_layers must be what was trained",
    )
    c.require(
        "transformer_layer_config.vocab_size",
        expected.vocab_size,
        layer.get("vocab_size"),
        fix="the draft borrows the target's embedding and LM head: train against the preset's target",
    )
    if expected.hidden_size is not None:
        c.require(
            "transformer_layer_config.hidden_size",
            expected.hidden_size,
            layer.get("hidden_size"),
            fix="the draft's hidden size is the target's",
        )
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and expected.hidden_size is not None:
        c.require("target_hidden_size", expected.hidden_size, target_hidden)
    c.require(
        "draft_vocab_size",
        expected.vocab_size,
        config.get("draft_vocab_size", layer.get("vocab_size")),
        fix="train on the full verifier vocabulary (no --draft-vocab-size): SGLang's draft has no token map",
    )
    aux = config.get("aux_hidden_state_layer_ids")
    shifted = [i + 1 for i in expected.target_layer_ids]
    c.require(
        "aux_hidden_state_layer_ids",
        shifted,
        aux,
        fix=f"train with --target-layer-ids {' '.join(map(str, shifted))} (the preset's layer ids + 1)",
    )
    c.require(
        "block_size", expected.block_size, config.get("block_size"), fix="train with the preset's block size"
    )
    mask = config.get("mask_token_id")
    if expected.mask_token_id is not None:
        c.require(
            "mask_token_id", expected.mask_token_id, mask, fix="train with the preset's dflash.mask_token_id"
        )
    else:
        c.require(
            "mask_token_id",
            f"an id in [0, {expected.vocab_size})",
            mask,
            ok=isinstance(mask, int) and 0 <= mask < expected.vocab_size,
        )
    anchor = config.get("sample_from_anchor")
    if expected.draft in ("dflash", "dflash2"):
        c.require(
            "sample_from_anchor",
            False,
            anchor,
            fix="SGLang's DFLASH worker treats the anchor as the bonus token: train with --no-sample-from-anchor",
        )
    else:
        c.require(
            "sample_from_anchor",
            expected.dspark.get("sample_from_anchor"),
            anchor,
            fix="set train.dspark.sample_from_anchor to what the checkpoint was trained with",
        )
    if expected.draft == "dflash2":
        c.require("sliding_window_non_causal", True, config.get("sliding_window_non_causal"))
        for key in DFLASH2_KEYS:
            c.require(
                key,
                expected.dflash2[key],
                config.get(key),
                fix=f"set train.dflash2.{key} to the trained value",
            )
    if expected.draft == "dspark":
        for key in (
            "markov_rank",
            "markov_head_type",
            "enable_confidence_head",
            "confidence_head_with_markov",
        ):
            c.require(
                key, expected.dspark[key], config.get(key), fix=f"set train.dspark.{key} to the trained value"
            )
        c.require(
            "markov_rank",
            "> 0",
            config.get("markov_rank"),
            ok=int(config.get("markov_rank") or 0) > 0,
            fix="SGLang refuses a DSpark draft without its Markov head",
        )
    vllm_semantics.check(config, expected.draft, semantics.causal_layers(config), c.require)
    _check_weights(c, tensors, expected, layer)
    return c


def _check_weights(
    c: Checks, tensors: Mapping[str, Any], expected: Expected, layer: Mapping[str, Any]
) -> None:
    names = set(tensors)
    for module in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        c.require(
            f"weights:{module}", "present", "present" if module in names else "missing", ok=module in names
        )
    for i in range(expected.num_draft_layers):
        prefix = f"layers.{i}."
        has = any(n.startswith(prefix) for n in names)
        c.require(f"weights:{prefix}*", "present", "present" if has else "missing", ok=has)
    extra = sorted(
        {n.split(".")[1] for n in names if n.startswith("layers.")}
        - {str(i) for i in range(expected.num_draft_layers)}
    )
    c.require(
        "weights:layers",
        f"{expected.num_draft_layers} layer(s)",
        f"extra layers {extra}" if extra else f"{expected.num_draft_layers} layer(s)",
        ok=not extra,
    )
    hidden = layer.get("hidden_size")
    fc = tensors.get("fc.weight", {})
    if hidden and fc.get("shape"):
        want = [hidden, len(expected.target_layer_ids) * hidden]
        c.require(
            "weights:fc.weight.shape",
            want,
            fc["shape"],
            fix="fc maps the concatenated target layers to the hidden size: the layer ids disagree",
        )
    if expected.draft == "dspark":
        has_markov = any(n.startswith("markov_head.") for n in names)
        c.require("weights:markov_head.*", "present", "present" if has_markov else "missing", ok=has_markov)
        if expected.dspark.get("enable_confidence_head"):
            has_conf = any(n.startswith("confidence_head.") for n in names)
            c.require(
                "weights:confidence_head.*", "present", "present" if has_conf else "missing", ok=has_conf
            )


# --- the transform --------------------------------------------------------------------------------------------


def sglang_config(config: Mapping[str, Any], expected: Expected) -> dict[str, Any]:
    """The SGLang draft config for a checked speculators config."""
    layer = dict(config["transformer_layer_config"])
    out: dict[str, Any] = {k: v for k, v in config.items() if k not in SPECULATORS_KEYS}
    out.update(layer)  # flattened: the decoder's own fields win over leftovers at the top level
    out["architectures"] = [ARCHITECTURES[expected.draft]]
    anchor = bool(config["sample_from_anchor"])
    block = int(config["block_size"])
    sglang_block = dspark_gamma(block, anchor) if expected.draft == "dspark" else block
    dflash_config: dict[str, Any] = {
        "target_layer_ids": [i - 1 for i in config["aux_hidden_state_layer_ids"]],
        "num_target_layers": expected.num_target_layers,
        "block_size": sglang_block,
        "mask_token_id": int(config["mask_token_id"]),
        "sample_from_anchor": anchor,
    }
    if expected.draft == "dflash2":
        dflash_config.update({k: int(config[k]) for k in DFLASH2_KEYS})
    if expected.draft == "dspark":
        dflash_config.update({"projector_type": "dspark", **{k: config[k] for k in DSPARK_KEYS}})
        for key in DSPARK_TOP_LEVEL_KEYS:
            out[key] = config[key]
    out["dflash_config"] = dflash_config
    out["block_size"] = sglang_block
    out["num_target_layers"] = expected.num_target_layers
    out["mask_token_id"] = int(config["mask_token_id"])
    out["sample_from_anchor"] = anchor
    semantics.write(out, trained(config, expected))
    return out


def trained(config: Mapping[str, Any], expected: Expected) -> semantics.Trained:
    """The training side of the semantic table (`semantics.py`) for a checked speculators config."""
    anchor = bool(config["sample_from_anchor"])
    block = int(config["block_size"])
    return semantics.Trained(
        draft=expected.draft,
        config=config,
        architecture=ARCHITECTURES[expected.draft],
        num_target_layers=expected.num_target_layers,
        block_size=dspark_gamma(block, anchor) if expected.draft == "dspark" else block,
        mask_token=semantics.resolve_mask_token(expected.vocab, int(config["mask_token_id"])),
    )


def sglang_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """What SGLang 0.5.23 reads from a draft config: `dflash_config` first, then the top level (DSpark: the
    confidence-head fields and `sample_from_anchor` from the top level, default true)."""
    nested = config.get("dflash_config") or {}

    def pick(key: str, default: Any = None) -> Any:
        return nested.get(key, config.get(key, default))

    view = {
        "architectures": config.get("architectures"),
        "num_hidden_layers": config.get("num_hidden_layers"),
        "target_layer_ids": pick("target_layer_ids"),
        "num_target_layers": pick("num_target_layers"),
        "block_size": pick("block_size"),
        "mask_token_id": pick("mask_token_id"),
        "conv_kernel_size": pick("conv_kernel_size", 0),
        "conv_group_size": pick("conv_group_size", 0),
        "selector_rank": pick("selector_rank", 0),
        "selector_top_k": pick("selector_top_k", 0),
        "markov_rank": {**nested, **(config.get("dspark_config") or {})}.get(
            "markov_rank", config.get("markov_rank", 0)
        ),
        "markov_head_type": nested.get("markov_head_type", config.get("markov_head_type")),
        "dspark_sample_from_anchor": bool(config.get("sample_from_anchor", True)),
        "enable_confidence_head": config.get("enable_confidence_head"),
        "confidence_head_with_markov": config.get("confidence_head_with_markov"),
        "has_transformer_layer_config": "transformer_layer_config" in config,
    }
    return view


def verify_output(
    folder: Path,
    expected: Expected,
    source_config: Mapping[str, Any],
    tensors: Mapping[str, Any],
    checks: Checks,
) -> None:
    """Re-read the written folder and check it the way SGLang reads it."""
    written = read_config(folder)
    view = sglang_view(written)
    c = Checks(str(folder / "config.json"))
    c.require("architectures", [ARCHITECTURES[expected.draft]], view["architectures"])
    c.require(
        "transformer_layer_config",
        "flattened",
        "nested" if view["has_transformer_layer_config"] else "flattened",
    )
    c.require("num_hidden_layers", expected.num_draft_layers, view["num_hidden_layers"])
    c.require("dflash_config.target_layer_ids", list(expected.target_layer_ids), view["target_layer_ids"])
    c.require("dflash_config.num_target_layers", expected.num_target_layers, view["num_target_layers"])
    anchor = bool(source_config["sample_from_anchor"])
    block = dspark_gamma(expected.block_size, anchor) if expected.draft == "dspark" else expected.block_size
    c.require("dflash_config.block_size", block, view["block_size"])
    c.require("dflash_config.mask_token_id", source_config["mask_token_id"], view["mask_token_id"])
    if expected.draft == "dflash2":
        for key in DFLASH2_KEYS:
            c.require(f"dflash_config.{key}", expected.dflash2[key], view[key])
    else:
        c.require("dflash_config.selector_rank", 0, view["selector_rank"])
    if expected.draft == "dspark":
        c.require("sample_from_anchor", anchor, view["dspark_sample_from_anchor"])
        for key in (
            "markov_rank",
            "markov_head_type",
            "enable_confidence_head",
            "confidence_head_with_markov",
        ):
            c.require(key, expected.dspark[key], view[key])
    semantics.check(written, trained(source_config, expected), c.require)
    checks.rows.extend({**row, "field": f"output:{row['field']}"} for row in c.rows)
    header = safetensors_header(folder / WEIGHTS)
    same = header == dict(tensors)
    checks.require("output:weights", "the checkpoint's tensors", "the same" if same else "different", ok=same)


def pick_epoch(checkpoints: Path, epoch: str | int) -> Path:
    """`latest` → the highest-numbered epoch folder (speculators names them 0, 1, …)."""
    if not checkpoints.is_dir():
        raise UserError("no training output folder", source=str(checkpoints), fix="run the train stage first")
    numbered = sorted((int(p.name), p) for p in checkpoints.iterdir() if p.is_dir() and p.name.isdigit())
    if str(epoch) == "latest":
        if not numbered:
            raise UserError("no epoch folder (0, 1, …) in the training output", source=str(checkpoints))
        return numbered[-1][1]
    chosen = checkpoints / str(epoch)
    if not chosen.is_dir():
        found = [n for n, _ in numbered]
        raise UserError(
            f"no epoch folder {epoch}",
            source=str(checkpoints),
            field="convert.checkpoint",
            fix=f"choose one of {found} or 'latest'",
        )
    return chosen


def convert(
    checkpoint: Path,
    output: Path,
    expected: Expected,
    probe: Callable[[Path, Mapping[str, Any]], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Check `checkpoint`, write the SGLang draft folder `output` (replaced whole), re-read and check it; then
    `probe(checkpoint, written config)` (the mask probe, `probe.py`) adds its rows or refuses, before `output`
    exists."""
    config = read_config(checkpoint)
    tensors = safetensors_header(checkpoint / WEIGHTS)
    checks = check_checkpoint(config, tensors, expected, str(checkpoint / "config.json"))
    converted = sglang_config(config, expected)
    staging = output.with_name(output.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    (staging / "config.json").write_text(
        json.dumps(converted, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    _link_or_copy(checkpoint / WEIGHTS, staging / WEIGHTS)
    verify_output(staging, expected, config, tensors, checks)
    if probe is not None:
        checks.rows.extend(probe(checkpoint, read_config(staging)))
    report = {
        "schema_version": 1,
        "draft": expected.draft,
        "architecture": ARCHITECTURES[expected.draft],
        "source": str(checkpoint),
        "source_config_sha256": sha256_file(checkpoint / "config.json"),
        "config_sha256": sha256_file(staging / "config.json"),
        "checks": checks.rows,
        "files": sorted(["config.json", WEIGHTS, REPORT]),
    }
    check(report, "stage-convert", str(staging / REPORT))
    atomic_write_json(staging / REPORT, report)
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    return report


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link when the filesystem allows it (weights can be large), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
