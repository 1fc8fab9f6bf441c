"""The tiny preset's Transformers extractor writes speculators' offline layout with vLLM's capture convention:
index k = decoder layer k-1's output before the final norm, the final layer last; resumable, whole files only."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.pipeline.stages.hsextract.transformers_extractor import extract, file_for

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return Qwen3ForCausalLM(config).eval()


ROWS = [(0, [1, 2, 3, 4, 5]), (1, [7, 8, 9]), (5, [10, 11, 12, 13])]


def test_files_keys_shapes_and_values(model, tmp_path):
    from safetensors.torch import load_file

    counts = extract(model, ROWS, tmp_path, [1, 2, 3], "float32")
    assert counts == {"rows": 3, "written": 3, "skipped": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hs_0.safetensors",
        "hs_1.safetensors",
        "hs_5.safetensors",
    ]
    data = load_file(str(file_for(tmp_path, 0)))
    assert set(data) == {"token_ids", "hidden_states"}
    assert data["token_ids"].dtype == torch.int64 and data["token_ids"].tolist() == [1, 2, 3, 4, 5]
    assert tuple(data["hidden_states"].shape) == (5, 3, 32)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), output_hidden_states=True)
    hs = data["hidden_states"]
    # Auxiliary slots: Transformers' hidden_states[k] (output of layer k-1).
    assert torch.allclose(hs[:, 0], out.hidden_states[1][0], atol=1e-6)
    assert torch.allclose(hs[:, 1], out.hidden_states[2][0], atol=1e-6)
    # The final slot is before the final norm (vLLM's capture); Transformers' last entry is after it.
    assert not torch.allclose(hs[:, 2], out.hidden_states[3][0], atol=1e-4)
    assert torch.allclose(model.model.norm(hs[:, 2]), out.hidden_states[3][0], atol=1e-5)


def test_rerun_skips_existing_files_and_leaves_no_partial(model, tmp_path):
    extract(model, ROWS[:1], tmp_path, [2, 3], "bfloat16")
    before = file_for(tmp_path, 0).stat().st_mtime_ns
    counts = extract(model, ROWS, tmp_path, [2, 3], "bfloat16")
    assert counts == {"rows": 3, "written": 2, "skipped": 1}
    assert file_for(tmp_path, 0).stat().st_mtime_ns == before
    assert not list(Path(tmp_path).glob("*.partial"))


def test_indices_outside_the_model_are_refused(model, tmp_path):
    with pytest.raises(UserError, match=r"outside 1\.\.3"):
        extract(model, ROWS, tmp_path, [0, 3], "float32")
    with pytest.raises(UserError, match=r"outside 1\.\.3"):
        extract(model, ROWS, tmp_path, [1, 4], "float32")
