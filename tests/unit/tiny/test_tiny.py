"""The shipped tiny models: hashes, tamper detection, offline loading, tokenizer and preset agreement."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from draftscope import tiny
from draftscope.core.errors import UserError
from draftscope.core.presets import load_model_preset
from draftscope.tiny.corpus import EXCLUDED_DIRS, load_corpus
from draftscope.tiny.models import DRAFT, MAX_POSITIONS, TARGET
from draftscope.tiny.preset_file import write_kit_model
from draftscope.tiny.tokenizer import MASK, SPECIAL_TOKENS, VOCAB_SIZE

WEIGHTS = "target/model.safetensors"


def test_shipped_files_match_their_recorded_hashes():
    files = tiny.expected_files()
    assert {"tokenizer.json", WEIGHTS, "draft/model.safetensors", "target/config.json"} <= set(files)
    assert tiny.check_files() == []
    total = sum((tiny.assets_dir() / rel).stat().st_size for rel in files)
    assert total < 8_000_000  # bf16, ~5 MB in all


def test_the_preset_states_the_models_geometry_and_measured_figures():
    preset = load_model_preset("tiny")
    km, arch = preset.kit_model, preset.architecture
    assert (km.hidden_size, km.intermediate_size) == (TARGET.hidden_size, TARGET.intermediate_size)
    assert (km.num_attention_heads, km.num_key_value_heads) == (
        TARGET.num_attention_heads,
        TARGET.num_key_value_heads,
    )
    assert (km.draft_hidden_size, km.draft_num_layers) == (DRAFT.hidden_size, DRAFT.num_layers)
    assert (arch.num_layers, arch.hidden_size) == (TARGET.num_layers, TARGET.hidden_size)
    assert (arch.vocab_size, arch.max_position_embeddings) == (VOCAB_SIZE, MAX_POSITIONS)
    assert preset.dflash.mask_token_id == SPECIAL_TOKENS.index(MASK)
    m = km.measured
    for key in (
        "target_validation_loss",
        "target_mean_top1_prob",
        "draft_tokens_per_target_call_k4",
        "corpus_sha256",
        "python_version",
        "torch_version",
        "build_seconds",
    ):
        assert key in m, key
    assert m["draft_tokens_per_target_call_k4_chat"] >= 2.0  # the demo's acceptance bar (issue 8)


def _copy_assets(tmp_path):
    folder = tmp_path / "tiny"
    shutil.copytree(tiny.assets_dir(), folder)
    return folder


def test_a_flipped_byte_is_detected_and_named(tmp_path):
    folder = _copy_assets(tmp_path)
    path = folder / WEIGHTS
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    problems = tiny.check_files(folder=folder)
    assert len(problems) == 1 and problems[0].startswith(f"{WEIGHTS}: SHA-256")
    with pytest.raises(UserError) as info:
        tiny.load_target(folder=folder)
    message = info.value.render()
    assert WEIGHTS in message and "invoke tiny.build" in message and "\n" not in message


def test_a_missing_file_is_detected(tmp_path):
    folder = _copy_assets(tmp_path)
    (folder / "tokenizer.json").unlink()
    assert tiny.check_files(folder=folder) == ["tokenizer.json: missing"]
    with pytest.raises(UserError, match=r"tokenizer\.json: missing"):
        tiny.load_tokenizer(folder=folder)


def test_models_load_offline_through_from_pretrained(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = tiny.load_target()
    draft = tiny.load_draft(dtype="bfloat16")
    assert type(target).__name__ == "Qwen3ForCausalLM" and not target.training
    assert target.dtype == torch.float32 and draft.dtype == torch.bfloat16
    assert target.config.hidden_size == TARGET.hidden_size and draft.config.hidden_size == DRAFT.hidden_size
    assert target.config.vocab_size == draft.config.vocab_size == VOCAB_SIZE
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([[1, 100, 200]])).logits
    assert logits.shape == (1, 3, VOCAB_SIZE) and torch.isfinite(logits).all()
    with pytest.raises(UserError, match="dtype"):
        tiny.load_target(dtype="float8")


def test_chat_template_round_trip(monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = tiny.load_tokenizer()
    assert len(tok) == VOCAB_SIZE
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def f(x):\n    return x  # ünïcode"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\ndef f(x):\n    return x  # ünïcode<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(1) == 3 and ids.count(2) == 2  # each chat marker is one token
    assert tok.decode(ids) == text
    without = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == without + "<|im_start|>assistant\n"


def test_check_task_verifies_and_loads(capsys):
    pytest.importorskip("torch")
    from invoke import Context

    from draftscope.cli.tiny import build, ns_tiny

    assert ns_tiny.name == "tiny" and "build" in ns_tiny.task_names
    build(Context(), check=True)
    out = capsys.readouterr().out
    assert f"ok  {WEIGHTS}" in out and "load offline" in out


def test_importing_the_package_does_not_import_torch():
    code = "import sys, draftscope.tiny, draftscope.cli.tiny; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_corpus_leaves_out_test_folders_and_third_party_code(tmp_path):
    for rel in (
        "a.py",
        "pkg/b.py",
        "test/t.py",
        "idlelib/idle_test/x.py",
        "lib2to3/tests/y.py",
        "site-packages/z.py",
        "pkg/notes.txt",
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n")
    corpus = load_corpus(tmp_path)
    assert [f.path for f in corpus.files] == ["a.py", "pkg/b.py"]
    assert {"test", "tests", "idle_test", "site-packages"} <= EXCLUDED_DIRS
    again = load_corpus(tmp_path)
    assert again.sha256 == corpus.sha256
    (tmp_path / "a.py").write_text("# changed\n")
    assert load_corpus(tmp_path).sha256 != corpus.sha256


def test_real_corpus_split_is_fixed():
    corpus = load_corpus()
    assert corpus.train and corpus.validation
    assert 0.02 < len(corpus.validation) / len(corpus.files) < 0.1
    assert not any(set(f.path.split("/")[:-1]) & EXCLUDED_DIRS for f in corpus.files)


def test_write_kit_model_touches_only_that_block(tmp_path):
    source = load_model_preset("tiny").path
    path = tmp_path / "models" / "tiny.yaml"
    path.parent.mkdir()
    shutil.copyfile(source, path)
    before = path.read_text().split("\n")
    write_kit_model(path, files={"x/y.bin": "a" * 64}, measured={"target_validation_loss": 3.1, "note": "n"})
    data = yaml.safe_load(path.read_text())
    assert data["kit_model"]["files"] == {"x/y.bin": "a" * 64}
    assert data["kit_model"]["measured"] == {"target_validation_loss": 3.1, "note": "n"}
    assert data["kit_model"]["hidden_size"] == TARGET.hidden_size
    after = path.read_text().split("\n")
    assert after[0] == before[0]  # the comment heading the file stays
    assert [line for line in after if line.startswith("dflash:")] == ["dflash:"]
    with pytest.raises(UserError, match=r"model-preset|measured"):
        write_kit_model(path, files={}, measured={"nested": {"no": 1}})


def test_stage_for_vllm_puts_the_tokenizer_beside_the_weights(tmp_path):
    from draftscope.core.jsonio import sha256_file
    from draftscope.tiny.assets import TOKENIZER_FILES

    files = tiny.expected_files()
    for which in ("target", "draft"):
        dest = tiny.stage_for_vllm(tmp_path / which, which)
        assert dest == tmp_path / which
        staged = sorted(p.name for p in dest.iterdir())
        weights = [rel.split("/", 1)[1] for rel in files if rel.startswith(f"{which}/")]
        assert staged == sorted([*weights, *TOKENIZER_FILES])
        for name in weights:
            assert sha256_file(dest / name) == files[f"{which}/{name}"]
        for name in TOKENIZER_FILES:
            assert sha256_file(dest / name) == files[name]
    # the folder is what a serving engine reads: a Transformers config with the tokenizer beside it
    assert '"Qwen3ForCausalLM"' in (tmp_path / "target" / "config.json").read_text()


def test_stage_for_vllm_reuses_a_good_folder_and_never_overwrites_a_different_file(tmp_path):
    dest = tiny.stage_for_vllm(tmp_path / "m")
    before = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    assert tiny.stage_for_vllm(dest) == dest
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == before  # nothing copied twice
    (dest / "config.json").write_text("{}")
    with pytest.raises(UserError) as info:
        tiny.stage_for_vllm(dest)
    message = info.value.render()
    assert "config.json" in message and "dest" in message and "fix:" in message and "\n" not in message
    assert (dest / "config.json").read_text() == "{}"  # left as it was


def test_stage_for_vllm_refuses_bad_input_and_tampered_assets(tmp_path, monkeypatch):
    with pytest.raises(UserError) as info:
        tiny.stage_for_vllm(tmp_path / "x", "drafts")
    message = info.value.render()
    assert "which" in message and "drafts" in message and "target, draft" in message
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="not a directory"):
        tiny.stage_for_vllm(tmp_path / "file")
    folder = _copy_assets(tmp_path)
    (folder / "tokenizer_config.json").write_text("{}")
    monkeypatch.setattr("draftscope.tiny.assets._ASSETS", folder)
    with pytest.raises(UserError, match=r"tokenizer_config\.json: SHA-256"):
        tiny.stage_for_vllm(tmp_path / "y")
    assert not (tmp_path / "y").exists()  # checked before anything is written
