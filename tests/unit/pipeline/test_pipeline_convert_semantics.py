"""convert's semantic table: every field by which SGLang decides what a draft computes is written explicitly from
the training config, and removing (or adding) any one of them is refused naming it; the mask token's string comes
from the target's tokenizer; SGLang's per-layer attention rules as the mask probe reads them."""

from __future__ import annotations

import json

import pytest
from test_pipeline_convert import _DROP, TARGET_VOCAB, checkpoint, expected, write_tokenizer

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.pipeline.config import DRAFTS
from draftscope.pipeline.stages.convert import checkpoint as C
from draftscope.pipeline.stages.convert import semantics as S
from draftscope.pipeline.stages.convert import vllm_semantics as V


def converted(tmp_path, draft: str, **changes) -> dict:
    C.convert(checkpoint(tmp_path, draft, **changes), tmp_path / "draft", expected(draft))
    return read_json(tmp_path / "draft" / "config.json")


def test_dflash2_writes_its_causality_and_mask_token_explicitly(tmp_path):
    written = converted(tmp_path, "dflash2")
    # speculators trains DFlash2's sliding layers bidirectional; SGLang makes a sliding layer causal unless told.
    assert written["is_causal"] is False
    assert written["layer_types"] == ["sliding_attention"] * 2 and written["sliding_window"] == 2048
    assert written["use_sliding_window"] is True
    assert (
        written["dflash_config"]["mask_token"] == "<|mask|>"
        and written["dflash_config"]["mask_token_id"] == 511
    )


@pytest.mark.parametrize(("draft", "causal"), [("dflash", True), ("dspark", True), ("dflash2", False)])
def test_causality_follows_the_training_flag(tmp_path, draft, causal):
    assert converted(tmp_path, draft)["is_causal"] is causal


def removable() -> list[tuple[str, str, str]]:
    cases = []
    for draft in DRAFTS:
        for f in S.applicable(draft):
            cases += [(draft, f.name, where) for where in f.at]
    return cases


@pytest.mark.parametrize(("draft", "name", "where"), removable())
def test_removing_any_field_is_refused_naming_it(tmp_path, monkeypatch, draft, name, where):
    original = C.sglang_config

    def without(config, exp):
        out = original(config, exp)
        (out if where == S.TOP else out[S.NESTED]).pop(name)
        return out

    monkeypatch.setattr(C, "sglang_config", without)
    with pytest.raises(UserError) as info:
        C.convert(checkpoint(tmp_path, draft), tmp_path / "draft", expected(draft))
    assert info.value.field == (name if where == S.TOP else f"{S.NESTED}.{name}"), info.value.render()
    assert not (tmp_path / "draft").exists()


def test_a_changed_value_is_refused_with_both_values(tmp_path, monkeypatch):
    original = C.sglang_config

    def flipped(config, exp):
        out = original(config, exp)
        out["is_causal"] = True
        return out

    monkeypatch.setattr(C, "sglang_config", flipped)
    with pytest.raises(UserError) as info:
        C.convert(checkpoint(tmp_path, "dflash2"), tmp_path / "draft", expected("dflash2"))
    text = info.value.render()
    assert info.value.field == "is_causal" and "expected False, found True" in text
    assert "--sliding-window-non-causal" in text  # the fix names the training option


@pytest.mark.parametrize("name", sorted(S.names(("absent",))))
def test_a_field_that_must_stay_absent_is_refused(tmp_path, monkeypatch, name):
    original = C.sglang_config

    def with_it(config, exp):
        out = original(config, exp)
        out[name] = {}
        return out

    monkeypatch.setattr(C, "sglang_config", with_it)
    with pytest.raises(UserError) as info:
        C.convert(checkpoint(tmp_path, "dspark"), tmp_path / "draft", expected("dspark"))
    assert info.value.field == name


def test_mixed_causality_cannot_be_written_explicitly_and_is_refused(tmp_path):
    mixed = {"transformer_layer_config.layer_types": ["full_attention", "sliding_attention"]}
    # vLLM's one dflash_config.causal (checked on the checkpoint first) cannot say it either
    with pytest.raises(UserError) as info:
        converted(tmp_path, "dflash", **mixed)
    assert (
        info.value.field == "vllm:causality"
        and "expected [False, True], found [True, True]" in info.value.render()
    )
    source = read_json(tmp_path / "checkpoints" / "0" / "config.json")
    trained = C.trained(source, expected("dflash"))
    with pytest.raises(UserError) as info:
        S.write({}, trained)
    assert info.value.field == "is_causal" and "--full-attention-indices" in info.value.render()


def test_vllm_reads_the_checkpoint_with_its_own_defaults(tmp_path):
    """vLLM serves the speculators checkpoint itself: a missing sliding_window_non_causal would make it
    bidirectional (its default) where speculators trained DFlash causal."""
    with pytest.raises(UserError) as info:
        converted(tmp_path, "dflash", sliding_window_non_causal=_DROP)
    assert info.value.field == "vllm:sliding_window_non_causal"
    source = read_json(tmp_path / "checkpoints" / "0" / "config.json")
    assert V.vllm_causal_layers(source) == [False, False] and S.causal_layers(source) == [True, True]
    dspark = read_json(checkpoint(tmp_path / "d", "dspark", sliding_window_non_causal=True) / "config.json")
    assert V.vllm_causal_layers(dspark) == [True, True]  # its DSpark adapter ignores the flag


def test_a_decoder_field_missing_from_training_is_refused(tmp_path):
    source = checkpoint(tmp_path, "dflash")
    config = read_json(source / "config.json")
    del config["transformer_layer_config"]["rms_norm_eps"]
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as info:
        C.convert(source, tmp_path / "draft", expected("dflash"))
    assert info.value.field == "transformer_layer_config.rms_norm_eps"


# --- the mask token's string ------------------------------------------------------------------------------------


def test_the_mask_token_is_the_targets_token_for_the_id(tmp_path):
    assert S.read_vocab(write_tokenizer(tmp_path / "t")) == TARGET_VOCAB
    assert S.resolve_mask_token(TARGET_VOCAB, 511) == "<|mask|>"


def test_an_id_without_a_token_gets_speculators_fallback_string():
    # speculators adds "<|MASK|>" to its tokenizer copy when the target has no mask token; the served target's
    # vocabulary then has no such string, which SGLang accepts with the explicit id.
    assert S.resolve_mask_token({"a": 0}, 7) == S.SPECULATORS_MASK_TOKEN


def test_a_mask_token_sglang_would_refuse_is_refused_now():
    with pytest.raises(UserError) as info:
        S.resolve_mask_token(
            {S.SPECULATORS_MASK_TOKEN: 5, "a": 0}, 7
        )  # SGLang: "conflicts with tokenizer vocab id"
    assert info.value.field == "mask_token"
    with pytest.raises(UserError, match="--tokenizer"):
        S.resolve_mask_token(None, 7)


# --- SGLang's attention rules, as the probe applies them (transformers loads the file as SGLang does) ---------------


def test_sglang_layer_rules_read_from_the_converted_config(tmp_path):
    """Where transformers is not the version SGLang loads configs with (the development .venv), the probe refuses
    to guess, and that refusal is what is checked; where it is (.venv-train, the train image), the rules are read.
    `make test-speculators` runs this test in .venv-train, so CI checks both branches and skips neither."""
    probe = pytest.importorskip("draftscope.pipeline.stages.convert.probe")
    transformers = pytest.importorskip("transformers")
    written = converted(tmp_path, "dflash2")
    if transformers.__version__ != probe.SGLANG_TRANSFORMERS:  # the host's: the probe refuses to guess
        with pytest.raises(UserError) as info:
            probe.sglang_layers(written)
        assert info.value.field == "transformers" and "train image" in info.value.render()
        return
    assert probe.sglang_layers(written) == [probe.LayerRule("sliding_attention", False, 2047)] * 2
    without = {k: v for k, v in written.items() if k != "is_causal"}
    assert {r.causal for r in probe.sglang_layers(without)} == {
        True
    }  # the silent default this issue is about
    with pytest.raises(UserError, match="sliding_window"):
        probe.sglang_layers({**written, "use_sliding_window": False})  # Qwen3Config drops the window
    assert probe.check_loaded(written)["ok"]
    with pytest.raises(UserError) as info:
        probe.check_loaded({**written, "use_sliding_window": False})
    assert info.value.field == "transformers:sliding_window"


def test_sglang_mask_geometry():
    torch = pytest.importorskip("torch")
    probe = pytest.importorskip("draftscope.pipeline.stages.convert.probe")
    causal = probe.sglang_mask(
        torch, probe.LayerRule("sliding_attention", True, 3), context=5, block=3, total=9
    )
    # rows: block queries at positions 5, 6, 7; columns: base positions 0..8, then the block's 5, 6, 7
    assert causal.tolist()[0] == [False, False] + [True] * 3 + [False] * 4 + [True, False, False]
    assert causal.tolist()[2] == [False] * 4 + [True] + [False] * 4 + [True, True, True]
    both = probe.sglang_mask(torch, probe.LayerRule("full_attention", False, -1), context=5, block=3, total=9)
    assert all(row == [True] * 5 + [False] * 4 + [True] * 3 for row in both.tolist())


def test_the_tiny_targets_tokenizer_folder_names_its_mask_token():
    """The stage passes the tokenizer folder (the tiny preset's sits beside its target folder, not in it)."""
    from draftscope.core.presets import load_model_preset
    from draftscope.pipeline.base import host_model_paths
    from draftscope.pipeline.config import load_pipeline_config

    preset = load_model_preset("tiny")
    model, tokenizer = host_model_paths(load_pipeline_config(draft="dflash2", preset="tiny"), preset)
    assert not (model / "tokenizer.json").exists()
    vocab = S.read_vocab(tokenizer)
    assert S.resolve_mask_token(vocab, preset.dflash.mask_token_id) == "<|mask|>"
