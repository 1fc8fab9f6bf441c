"""convert: speculators checkpoints (written here from speculators 0.9.0's documented config format) → SGLang
draft folders; every contract applied, every violation refused naming the field, and the output re-read."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.presets import load_model_preset, model_preset_names
from draftscope.core.schema import problems
from draftscope.pipeline.__main__ import main as pipeline_main
from draftscope.pipeline.__main__ import parser as pipeline_parser
from draftscope.pipeline.config import DRAFTS
from draftscope.pipeline.stages.convert import checkpoint as C
from draftscope.pipeline.stages.convert import entry

HIDDEN, VOCAB, RANK = 64, 512, 8
MASK_TOKEN = "<|mask|>"
# The target tokenizer's vocabulary as convert reads it (tokenizer.json): the mask token is id 511.
TARGET_VOCAB = {"<|endoftext|>": 0, "a": 1, MASK_TOKEN: 511}
SPECULATORS_ARCH = {
    "dflash": "DFlashSpeculator",
    "dflash2": "DFlash2DraftModel",
    "dspark": "DSparkSpeculator",
}


def speculators_config(draft: str, **changes) -> dict:
    """A checkpoint config.json as speculators 0.9.0 writes it (SpeculatorModelConfig.to_dict: the pydantic fields
    of DFlash/DFlash2/DSparkSpeculatorConfig at the top level, the decoder's Qwen3Config diff nested)."""
    config = {
        "architectures": [SPECULATORS_ARCH[draft]],
        "speculators_model_type": draft,
        "speculators_version": "0.9.0",
        "transformer_layer_config": {
            "model_type": "qwen3",
            "hidden_size": HIDDEN,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": VOCAB,
            "layer_types": ["sliding_attention", "sliding_attention"],
            "sliding_window": 2048,
            "use_sliding_window": True,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-06,
            "attention_bias": False,
            "max_position_embeddings": 512,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "draft_vocab_size": VOCAB,
        "block_size": 4,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [2, 3],
        "mask_token_id": 511,
        "sliding_window_non_causal": draft == "dflash2",
        "sample_from_anchor": draft == "dspark",
        "speculators_config": {
            "algorithm": draft,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "/models/target", "architectures": ["Qwen3ForCausalLM"]},
        },
        "dtype": "bfloat16",
    }
    if draft == "dflash2":
        config.update(conv_kernel_size=2, conv_group_size=16, selector_rank=RANK, selector_top_k=4)
    if draft == "dspark":
        config.update(
            markov_rank=RANK,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        )
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".", 1)
            config[outer][inner] = value
        elif value is _DROP:
            config.pop(key)
        else:
            config[key] = value
    if isinstance(config.get("block_size"), int) and "speculators_config" not in changes:
        # speculators: the whole block drafts when the anchor samples, all but the anchor otherwise
        tokens = config["block_size"] - (0 if config.get("sample_from_anchor") else 1)
        config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = tokens
    return config


_DROP = object()


def tensor_shapes(draft: str, *, layers: int = 2, aux: int = 2) -> dict[str, list[int]]:
    shapes = {
        "fc.weight": [HIDDEN, aux * HIDDEN],
        "hidden_norm.weight": [HIDDEN],
        "norm.weight": [HIDDEN],
        "verifier_norm.weight": [HIDDEN],
    }
    for i in range(layers):
        shapes[f"layers.{i}.self_attn.q_proj.weight"] = [HIDDEN, HIDDEN]
        shapes[f"layers.{i}.input_layernorm.weight"] = [HIDDEN]
    if draft == "dspark":
        shapes["markov_head.markov_w1.weight"] = [VOCAB, RANK]
        shapes["markov_head.markov_w2.weight"] = [VOCAB, RANK]
        shapes["confidence_head.proj.weight"] = [1, HIDDEN + RANK]
    return shapes


def write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A valid safetensors file of float32 zeros, written without torch (8-byte header length, JSON, data)."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def write_tokenizer(folder: Path) -> Path:
    """A target folder whose tokenizer.json holds TARGET_VOCAB (the model's vocabulary, the mask token added)."""
    folder.mkdir(parents=True)
    model = {k: v for k, v in TARGET_VOCAB.items() if k != MASK_TOKEN}
    added = [{"id": TARGET_VOCAB[MASK_TOKEN], "content": MASK_TOKEN, "special": True}]
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "BPE", "vocab": model}, "added_tokens": added})
    )
    return folder


def checkpoint(root: Path, draft: str, epoch: int = 0, shapes=None, **changes) -> Path:
    folder = root / "checkpoints" / str(epoch)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(speculators_config(draft, **changes)))
    write_safetensors(folder / "model.safetensors", shapes if shapes is not None else tensor_shapes(draft))
    return folder


def expected(draft: str, **changes) -> C.Expected:
    values = dict(
        draft=draft,
        target_layer_ids=(1, 2),
        num_target_layers=4,
        num_draft_layers=2,
        block_size=4,
        vocab_size=VOCAB,
        mask_token_id=511,
        hidden_size=HIDDEN,
        dflash2={"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": RANK, "selector_top_k": 4}
        if draft == "dflash2"
        else {},
        dspark={
            "markov_rank": RANK,
            "markov_head_type": "vanilla",
            "enable_confidence_head": True,
            "confidence_head_with_markov": True,
            "sample_from_anchor": True,
        }
        if draft == "dspark"
        else {},
        vocab=TARGET_VOCAB,
    )
    values.update(changes)
    return C.Expected(**values)


# --- the transform ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", DRAFTS)
def test_convert_writes_an_sglang_draft_folder_and_a_valid_report(tmp_path, draft):
    source = checkpoint(tmp_path, draft)
    out = tmp_path / "draft"
    report = C.convert(source, out, expected(draft))
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "draftscope-convert.json",
        "model.safetensors",
    ]
    assert not (tmp_path / "draft.partial").exists()
    written = read_json(out / "config.json")
    assert written["architectures"] == [C.ARCHITECTURES[draft]]
    assert "transformer_layer_config" not in written and "speculators_config" not in written
    assert "aux_hidden_state_layer_ids" not in written and "speculators_model_type" not in written
    assert (
        written["model_type"] == "qwen3"
        and written["hidden_size"] == HIDDEN
        and written["num_hidden_layers"] == 2
    )
    nested = written["dflash_config"]
    assert nested["target_layer_ids"] == [1, 2]  # aux ids minus one
    assert nested["num_target_layers"] == 4 and nested["mask_token_id"] == 511
    assert written["dtype"] == "bfloat16"  # the checkpoint's own top-level fields survive
    assert (out / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    assert problems(read_json(out / C.REPORT), "stage-convert") == []
    assert report["checks"] and all(row["ok"] for row in report["checks"])
    assert any(row["field"].startswith("output:") for row in report["checks"])


def test_dflash_block_and_anchor(tmp_path):
    C.convert(checkpoint(tmp_path, "dflash"), tmp_path / "draft", expected("dflash"))
    written = read_json(tmp_path / "draft" / "config.json")
    assert written["block_size"] == written["dflash_config"]["block_size"] == 4
    assert (
        written["sample_from_anchor"] is False and written["dflash_config"]["selector_rank"] == 0
    )  # no selector


def test_dflash2_carries_selector_and_conv_fields_in_dflash_config(tmp_path):
    C.convert(checkpoint(tmp_path, "dflash2"), tmp_path / "draft", expected("dflash2"))
    nested = read_json(tmp_path / "draft" / "config.json")["dflash_config"]
    assert {k: nested[k] for k in C.DFLASH2_KEYS} == {
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": RANK,
        "selector_top_k": 4,
    }


@pytest.mark.parametrize(("anchor", "gamma"), [(True, 4), (False, 3)])
def test_dspark_writes_gamma_and_the_anchor_flag_explicitly(tmp_path, anchor, gamma):
    exp = expected("dspark", dspark={**expected("dspark").dspark, "sample_from_anchor": anchor})
    C.convert(checkpoint(tmp_path, "dspark", sample_from_anchor=anchor), tmp_path / "draft", exp)
    written = read_json(tmp_path / "draft" / "config.json")
    # SGLang defaults a missing sample_from_anchor to true: it is always written, at the top level.
    assert written["sample_from_anchor"] is anchor
    assert written["block_size"] == written["dflash_config"]["block_size"] == gamma
    for key in ("enable_confidence_head", "confidence_head_with_markov", "markov_rank"):
        assert key in written
    assert (
        written["dflash_config"]["markov_rank"] == RANK
        and written["dflash_config"]["markov_head_type"] == "vanilla"
    )
    view = C.sglang_view(written)
    assert view["dspark_sample_from_anchor"] is anchor and view["block_size"] == gamma


# --- refusals: each names the field ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "changes", "field"),
    [
        ("dflash", {"aux_hidden_state_layer_ids": [1, 2]}, "aux_hidden_state_layer_ids"),
        ("dflash", {"aux_hidden_state_layer_ids": [2, 3, 4]}, "aux_hidden_state_layer_ids"),
        ("dflash", {"block_size": 8}, "block_size"),
        ("dflash", {"mask_token_id": 510}, "mask_token_id"),
        ("dflash", {"sample_from_anchor": True}, "sample_from_anchor"),
        ("dflash2", {"sample_from_anchor": True}, "sample_from_anchor"),
        ("dflash", {"speculators_model_type": "dspark"}, "speculators_model_type"),
        ("dflash", {"draft_vocab_size": 256}, "draft_vocab_size"),
        ("dflash", {"transformer_layer_config.vocab_size": 256}, "transformer_layer_config.vocab_size"),
        (
            "dflash",
            {"transformer_layer_config.num_hidden_layers": 3},
            "transformer_layer_config.num_hidden_layers",
        ),
        ("dflash", {"transformer_layer_config.hidden_size": 128}, "transformer_layer_config.hidden_size"),
        ("dflash", {"transformer_layer_config": _DROP}, "transformer_layer_config"),
        ("dflash2", {"selector_rank": _DROP}, "selector_rank"),
        ("dflash2", {"conv_group_size": 8}, "conv_group_size"),
        ("dflash2", {"sliding_window_non_causal": False}, "sliding_window_non_causal"),
        ("dspark", {"markov_rank": 16}, "markov_rank"),
        ("dspark", {"markov_head_type": "gated"}, "markov_head_type"),
        ("dspark", {"enable_confidence_head": False}, "enable_confidence_head"),
        ("dspark", {"sample_from_anchor": False}, "sample_from_anchor"),
    ],
)
def test_inconsistent_checkpoints_are_refused_naming_the_field(tmp_path, draft, changes, field):
    source = checkpoint(tmp_path, draft, **changes)
    with pytest.raises(UserError) as info:
        C.convert(source, tmp_path / "draft", expected(draft))
    assert info.value.field == field
    assert f"{field}:" in info.value.render() and "\n" not in info.value.render()
    assert not (tmp_path / "draft").exists() and not (tmp_path / "draft.partial").exists()


@pytest.mark.parametrize(
    ("shapes", "field"),
    [
        (
            {k: v for k, v in tensor_shapes("dflash").items() if not k.startswith("layers.1.")},
            "weights:layers.1.*",
        ),
        ({k: v for k, v in tensor_shapes("dflash").items() if k != "fc.weight"}, "weights:fc.weight"),
        (tensor_shapes("dflash", aux=3), "weights:fc.weight.shape"),
        (tensor_shapes("dflash", layers=3), "weights:layers"),
    ],
)
def test_weights_missing_what_sglang_loads_are_refused(tmp_path, shapes, field):
    with pytest.raises(UserError) as info:
        C.convert(checkpoint(tmp_path, "dflash", shapes=shapes), tmp_path / "draft", expected("dflash"))
    assert info.value.field == field


def test_the_preset_disagreeing_with_the_checkpoint_names_the_field(tmp_path):
    source = checkpoint(tmp_path, "dflash")
    with pytest.raises(UserError) as info:
        C.convert(source, tmp_path / "draft", expected("dflash", target_layer_ids=(0, 2)))
    assert (
        info.value.field == "aux_hidden_state_layer_ids" and "--target-layer-ids 1 3" in info.value.render()
    )
    with pytest.raises(UserError) as info:
        C.convert(source, tmp_path / "draft", expected("dflash", block_size=8))
    assert info.value.field == "block_size"


def test_a_wrong_transform_is_caught_when_the_output_is_re_read(tmp_path, monkeypatch):
    original = C.sglang_config

    def off_by_one(config, exp):
        out = original(config, exp)
        out["dflash_config"]["target_layer_ids"] = list(config["aux_hidden_state_layer_ids"])
        return out

    monkeypatch.setattr(C, "sglang_config", off_by_one)
    with pytest.raises(UserError) as info:
        C.convert(checkpoint(tmp_path, "dflash"), tmp_path / "draft", expected("dflash"))
    assert info.value.field == "dflash_config.target_layer_ids"
    assert not (tmp_path / "draft").exists()


def test_a_converted_folder_is_replaced_whole(tmp_path):
    C.convert(checkpoint(tmp_path, "dflash"), tmp_path / "draft", expected("dflash"))
    (tmp_path / "draft" / "stale.txt").write_text("x")
    C.convert(tmp_path / "checkpoints" / "0", tmp_path / "draft", expected("dflash"))
    assert not (tmp_path / "draft" / "stale.txt").exists()


# --- epochs, the in-container command, and the planned arguments -------------------------------------------------


def test_latest_epoch_and_a_missing_epoch(tmp_path):
    checkpoint(tmp_path, "dflash", epoch=0)
    checkpoint(tmp_path, "dflash", epoch=2)
    (tmp_path / "checkpoints" / "epoch2_end").mkdir()
    assert C.pick_epoch(tmp_path / "checkpoints", "latest").name == "2"
    with pytest.raises(UserError, match=r"choose one of \[0, 2\]"):
        C.pick_epoch(tmp_path / "checkpoints", 5)


def test_the_in_container_command_converts_and_writes_its_result(tmp_path):
    checkpoint(tmp_path, "dspark")
    result = tmp_path / "stages" / "convert.result.json"
    argv = [
        "convert",
        "--result",
        str(result),
        "--checkpoints",
        str(tmp_path / "checkpoints"),
        "--output",
        str(tmp_path / "draft"),
        "--draft",
        "dspark",
        "--target-layer-ids",
        "1",
        "2",
        "--num-target-layers",
        "4",
        "--num-draft-layers",
        "2",
        "--block-size",
        "4",
        "--vocab-size",
        str(VOCAB),
        "--mask-token-id",
        "511",
        "--hidden-size",
        str(HIDDEN),
        "--markov-rank",
        str(RANK),
        "--markov-head-type",
        "vanilla",
        "--enable-confidence-head",
        "--confidence-head-with-markov",
        "--sample-from-anchor",
        "--tokenizer",
        str(write_tokenizer(tmp_path / "target")),
        "--no-mask-probe",  # torch and speculators are not here: tests/integration probes the trained drafts
    ]
    assert pipeline_main(argv) == 0
    done = read_json(result)
    assert done["exit_code"] == 0 and done["counts"]["epoch"] == 0 and done["versions"]["draftscope"]
    argv[argv.index("--block-size") + 1] = "8"
    assert pipeline_main(argv) == 2  # a refusal is a one-line error and exit code 2


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("preset", model_preset_names())
def test_planned_convert_arguments_carry_the_presets_geometry(preset, draft):
    from test_pipeline_plan import build, stage_plan

    argv = list(stage_plan(build(preset, draft), "convert").step.argv)
    args = pipeline_parser().parse_args(argv[argv.index("convert") :])
    exp = entry.expected_from_args(args)
    model = load_model_preset(preset)
    assert exp.target_layer_ids == tuple(model.dflash.target_layer_ids)
    assert exp.block_size == model.dflash.block_size and exp.mask_token_id == model.dflash.mask_token_id
    assert exp.num_target_layers == model.architecture.num_layers
    assert exp.vocab_size == model.architecture.vocab_size
