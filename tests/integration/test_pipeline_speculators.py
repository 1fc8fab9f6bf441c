"""pretokenize → prepare → hsextract → train → convert on a CPU with the real speculators 0.9.0, through
`invoke pipeline --runtime local`, for each draft type; the hidden states load through speculators' own dataset code.

Needs an environment with speculators 0.9.0 (it caps transformers at 5.19.0 and datasets at 5.1.0, so it is not in the
kit's host environment): skipped where it is not installed. The target is a small random Qwen3 with the kit's
tokenizer, built here; training is one short epoch through the kit's CPU device shim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from support import INVOKE_PIPELINE, SMALL_QWEN3_PRESET

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("speculators")
pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

PRESET = SMALL_QWEN3_PRESET
STAGES = "pretokenize,prepare,hsextract,train,convert"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import inspect

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from draftscope.tiny import tokenizer as T

    root = tmp_path_factory.mktemp("spec")
    (root / "presets" / "models").mkdir(parents=True)
    (root / "presets" / "models" / "small.yaml").write_text(PRESET)
    model = root / "model"
    T.save_tokenizer(T.wrap(T.train_tokenizer([inspect.getsource(json)] * 3, vocab_size=512)), model)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    Qwen3ForCausalLM(config).save_pretrained(str(model))
    rows = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": f"def f{i}(x):"},
                {"role": "assistant", "content": f"    return x * {i}"},
            ],
        }
        for i in range(20)
    ]
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def run(setup: Path, workdir: Path, draft: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRAFTSCOPE_PRESETS": str(setup / "presets")}
    args = [
        "pipeline",
        "--preset",
        "small",
        "--draft",
        draft,
        "--runtime",
        "local",
        "--workdir",
        str(workdir),
        "--stage",
        STAGES,
        "--opts",
        "device=cpu",
        "--opts",
        f"model_path={setup / 'model'}",
        "--opts",
        f"data.chat={setup / 'chat.jsonl'}",
        "--opts",
        "train.hidden_states_dtype=float32",
        "--opts",
        "prepare.workers=1",
        "--opts",
        "train.dspark.markov_rank=8",
        "--opts",
        "train.dflash2.selector_rank=8",
        "--opts",
        "train.dflash2.selector_top_k=4",
    ]
    return subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.parametrize("draft", ["dflash", "dspark", "dflash2"])
def test_cpu_pipeline_with_real_speculators(setup, tmp_path, draft):
    workdir = tmp_path / "w"
    result = run(setup, workdir, draft)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for stage in STAGES.split(","):
        record = read_json(workdir / "stages" / f"{stage}.json")
        assert record["status"] == "completed" and problems(record, "stage-record") == [], stage
    assert read_json(workdir / "stages" / "train.json")["versions"]["speculators"] == "0.9.0"
    assert (workdir / "checkpoints" / "0" / "train_command.txt").is_file()
    converted = read_json(workdir / "draft" / "config.json")
    assert converted["dflash_config"]["target_layer_ids"] == [1, 2]
    report = read_json(workdir / "draft" / "draftscope-convert.json")
    assert problems(report, "stage-convert") == []
    check_semantics_and_mask_probe(workdir, draft, converted, report)
    again = run(setup, workdir, draft)
    assert again.returncode == 0 and again.stdout.count(": skipped") == len(STAGES.split(","))


def check_semantics_and_mask_probe(workdir: Path, draft: str, converted: dict, report: dict) -> None:
    """The trained draft's causality and mask token are written explicitly; the convert stage compared speculators'
    training masks with SGLang's for every layer; a flipped is_causal fails that probe, naming the layer."""
    from draftscope.core.errors import UserError
    from draftscope.pipeline.stages.convert import probe

    # DFlash2 trains its sliding layers bidirectional (--sliding-window-non-causal); DFlash and DSpark causal.
    assert (
        converted["is_causal"] is (draft != "dflash2")
        and converted["layer_types"] == ["sliding_attention"] * 2
    )
    assert converted["dflash_config"]["mask_token"] == "<|mask|>"  # id 3 of the kit's tokenizer
    rows = [r for r in report["checks"] if r["field"].startswith("probe:")]
    assert [r["field"] for r in rows] == ["probe:config", "probe:layer0", "probe:layer1"], rows
    assert all(r["ok"] for r in rows)
    print(draft, rows[1]["found"])
    flipped = {**converted, "is_causal": not converted["is_causal"]}
    with pytest.raises(UserError) as info:
        probe.run(workdir / "checkpoints" / "0", flipped, max_context=128)
    assert info.value.field == "probe:layer0" and "block position" in info.value.render()
    print(info.value.render())


def test_hidden_states_load_through_speculators_dataset(setup, tmp_path):
    from hs_connectors.transfer import FileTransfer
    from speculators.train.data import ArrowDataset

    workdir = tmp_path / "w"
    env = {**os.environ, "DRAFTSCOPE_PRESETS": str(setup / "presets")}
    args = [
        "pipeline",
        "--preset",
        "small",
        "--runtime",
        "local",
        "--workdir",
        str(workdir),
        "--stage",
        "pretokenize,prepare,hsextract",
        "--opts",
        "device=cpu",
        "--opts",
        f"model_path={setup / 'model'}",
        "--opts",
        f"data.chat={setup / 'chat.jsonl'}",
        "--opts",
        "prepare.workers=1",
    ]
    done = subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dataset = ArrowDataset(
        max_len=128,
        datapath=str(workdir / "prepare"),
        transfer=FileTransfer(workdir / "hidden_states"),
        on_missing="raise",
        hidden_states_dtype=torch.float32,
    )
    item = dataset[0]
    length = item["input_ids"].shape[0]
    assert tuple(item["hidden_states"].shape) == (length, 2 * 64)  # the two auxiliary layers, concatenated
    assert tuple(item["verifier_last_hidden_states"].shape) == (length, 64)


TINY_STAGES = "regen,pretokenize,prepare,hsextract,train,convert"


@pytest.mark.timeout(900)  # its own bound is 15 minutes (below); pytest's default 300 s is for single stages
def test_tiny_preset_end_to_end_with_no_input_then_every_stage_skips(tmp_path):
    """The acceptance run: the kit-built tiny target regenerates the example chat rows behind its loopback server,
    then pretokenize → prepare → hsextract → train (real speculators, CPU shim) → convert, with no option at all."""
    import time

    workdir = tmp_path / "w"
    args = [
        "pipeline",
        "--preset",
        "tiny",
        "--runtime",
        "local",
        "--stage",
        TINY_STAGES,
        "--workdir",
        str(workdir),
    ]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert seconds < 15 * 60
    for stage in TINY_STAGES.split(","):
        record = read_json(workdir / "stages" / f"{stage}.json")
        assert record["status"] == "completed" and problems(record, "stage-record") == [], stage
    regen = read_json(workdir / "regen" / "summary.json")
    assert regen["input"] == regen["ok"] == 64 and regen["missing"] == []
    pretokenized = read_json(workdir / "stages" / "pretokenize.json")
    assert any(
        i["path"].endswith("regen/rows.jsonl") for i in pretokenized["inputs"]
    )  # regen's rows, not data.chat
    assert read_json(workdir / "hsextract" / "summary.json")["files"] == pretokenized["counts"]["rows"]
    converted = read_json(workdir / "draft" / "config.json")
    assert (
        converted["dflash_config"]["target_layer_ids"] == [0, 1]
        and converted["dflash_config"]["mask_token_id"] == 3
    )
    assert problems(read_json(workdir / "draft" / "draftscope-convert.json"), "stage-convert") == []
    again = subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 0 and again.stdout.count(": skipped") == len(TINY_STAGES.split(","))
