"""`tiny.build` with a handful of steps: two builds into fresh folders give the same files, bit for bit."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftscope import tiny
from draftscope.core.errors import UserError
from draftscope.core.presets import load_model_preset
from draftscope.tiny import builder as build_mod

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_two_builds_give_identical_files(tmp_path):
    first = tiny.build(tmp_path / "a", target_steps=3, draft_steps=2, measure=True)
    second = tiny.build(tmp_path / "b", target_steps=3, draft_steps=2, measure=False)
    assert first["files"] == second["files"]
    assert {"tokenizer.json", "target/model.safetensors", "draft/model.safetensors"} <= set(first["files"])
    m = first["measured"]
    assert m["target_steps"] == 3 and m["python_version"] and len(m["corpus_sha256"]) == 64
    assert m["draft_tokens_per_target_call_k4"] >= 1.0 and m["target_validation_loss"] > 0
    assert (tmp_path / "a" / build_mod.RECORD_NAME).is_file()

    # The comparison with the shipped files names every file; a 3-step build reproduces none of the weights.
    lines, reproduced = tiny.report_lines(first)
    assert not reproduced and any(line.startswith("target/model.safetensors: DIFFERS") for line in lines)

    # Installing into a scratch copy of the assets and preset records the hashes and figures there.
    assets = tmp_path / "assets"
    preset_path = tmp_path / "models" / "tiny.yaml"
    preset_path.parent.mkdir()
    shutil.copyfile(load_model_preset("tiny").path, preset_path)
    build_mod.install(tmp_path / "a", first, assets=assets, preset_path=preset_path)
    preset = load_model_preset(str(preset_path))
    assert dict(preset.kit_model.files) == first["files"]
    assert tiny.check_files(preset, folder=assets) == []
    assert tiny.load_target(folder=assets, preset=preset).config.num_hidden_layers == 3

    with pytest.raises(UserError, match="not empty"):
        tiny.build(tmp_path / "a", target_steps=1, draft_steps=1)
