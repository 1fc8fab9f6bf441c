"""Faults injected into the real training stages, in the speculators environment (`.venv-train`, as `.ci/run` builds
it; speculators 0.9.0 caps transformers below the kit's host environment): `invoke pipeline --runtime local` on a
small random Qwen3 (the setup of tests/integration/test_pipeline_speculators.py), with

- the hsextract stage SIGKILLed at a seeded moment, then rerun (pretokenize and prepare are skipped, not redone);
- the train stage SIGKILLed at a seeded moment, and its supervisor sent SIGTERM while the checkpoint is saved;
- a final rerun that completes and leaves a loadable checkpoint.

After every fault the stage record says failed or interrupted with the signal, lists no output as final, and every
earlier stage's record is unchanged."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from faultlib import ROOT, kill_group, pipeline_argv, signal_name, start, wait_for_child
from support import SMALL_QWEN3_PRESET, unavailable

pytestmark = pytest.mark.reliability

TRAIN_PYTHON = Path(os.environ.get("DRAFTSCOPE_TRAIN_PYTHON", ROOT / ".venv-train" / "bin" / "python"))
PRESET = SMALL_QWEN3_PRESET
SETUP = """
import inspect, json, sys
from pathlib import Path
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from draftscope.tiny import tokenizer as T
root = Path(sys.argv[1])
T.save_tokenizer(T.wrap(T.train_tokenizer([inspect.getsource(json)] * 3, vocab_size=512)), root / "model")
torch.manual_seed(0)
config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
Qwen3ForCausalLM(config).save_pretrained(str(root / "model"))
rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"def f{i}(x):"},
                                     {"role": "assistant", "content": f"    return x * {i}"}]} for i in range(24)]
(root / "chat.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
"""


def have_speculators() -> bool:
    if not TRAIN_PYTHON.is_file():
        return False
    probe = subprocess.run(
        [str(TRAIN_PYTHON), "-c", "import speculators, datasets, draftscope"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    if not have_speculators():
        unavailable(f"no speculators environment at {TRAIN_PYTHON} (build it as .ci/run does)")
    root = tmp_path_factory.mktemp("train")
    (root / "presets" / "models").mkdir(parents=True)
    (root / "presets" / "models" / "small.yaml").write_text(PRESET)
    subprocess.run([str(TRAIN_PYTHON), "-c", SETUP, str(root)], check=True, capture_output=True, timeout=300)
    return root


def argv(small: Path, stages: str) -> tuple[list[str], dict[str, str]]:
    args = pipeline_argv(
        "--preset",
        "small",
        "--draft",
        "dflash",
        "--runtime",
        "local",
        "--workdir",
        str(small / "w"),
        "--stage",
        stages,
        "--opts",
        "device=cpu",
        "--opts",
        f"model_path={small / 'model'}",
        "--opts",
        f"data.chat={small / 'chat.jsonl'}",
        "--opts",
        "train.hidden_states_dtype=float32",
        "--opts",
        "prepare.workers=1",
        python=str(TRAIN_PYTHON),
    )
    return args, {"DRAFTSCOPE_PRESETS": str(small / "presets")}


def record(small: Path, stage: str) -> dict:
    facts = read_json(small / "w" / "stages" / f"{stage}.json")
    assert problems(facts, "stage-record") == []
    return facts


def records_bytes(small: Path, stages: list[str]) -> dict[str, bytes]:
    return {s: (small / "w" / "stages" / f"{s}.json").read_bytes() for s in stages}


def whole_hidden_states(folder: Path) -> tuple[dict[str, bytes], int]:
    """(name → bytes of every file under its final name, how many of them do not load)."""
    from safetensors import safe_open

    files, broken = {}, 0
    for path in sorted(folder.glob("hs_*.safetensors")):
        files[path.name] = path.read_bytes()
        try:
            with safe_open(str(path), framework="pt") as f:
                f.get_tensor("hidden_states")
        except Exception:
            broken += 1
    return files, broken


def run_until_done(small: Path, stages: str, log: Path) -> subprocess.Popen:
    args, env = argv(small, stages)
    proc = start(args, env, log=log)
    proc.wait(timeout=900)
    return proc


def test_training_stages_survive_kills_and_rerun(small, tmp_path, figures, seed):
    rng = random.Random(f"{seed}:train")
    hs_dir = small / "w" / "hidden_states"

    # 1. hsextract killed (SIGKILL to the stage's process group) at a seeded moment after it starts.
    delay = rng.uniform(0.5, 4.0)
    with figures.fault(
        "hsextract", f"stage SIGKILL at +{delay:.1f} s (real stage, speculators env)"
    ) as fault:
        args, env = argv(small, "pretokenize,prepare,hsextract")
        proc = start(args, env, log=tmp_path / "hs-killed.log")
        stage = wait_for_child(proc, "draftscope.pipeline hsextract", timeout=300)
        time.sleep(delay)
        before, _ = whole_hidden_states(hs_dir) if hs_dir.is_dir() else ({}, 0)
        kill_group(stage, signal.SIGKILL)
        proc.wait(timeout=120)
        after, broken = whole_hidden_states(hs_dir) if hs_dir.is_dir() else ({}, 0)
        fault.tear(broken)
        fault.lose(sum(1 for name, data in before.items() if after.get(name) != data))
        assert proc.returncode == 1
        facts = record(small, "hsextract")
        assert (
            facts["status"] == "failed" and "killed by SIGKILL" in facts["reason"] and facts["outputs"] == []
        )
        assert record(small, "pretokenize")["status"] == record(small, "prepare")["status"] == "completed"
    earlier = records_bytes(small, ["pretokenize", "prepare"])

    with figures.rerun("hsextract", "rerun: pretokenize and prepare skipped, hsextract completes") as rerun:
        proc = run_until_done(small, "pretokenize,prepare,hsextract", tmp_path / "hs-rerun.log")
        output = (tmp_path / "hs-rerun.log").read_text()
        assert proc.returncode == 0, output[-3000:]
        assert "pretokenize: skipped" in output and "prepare: skipped" in output
        rerun.lose(sum(earlier[s] != b for s, b in records_bytes(small, ["pretokenize", "prepare"]).items()))
        assert record(small, "hsextract")["status"] == "completed"
    earlier = records_bytes(small, ["pretokenize", "prepare", "hsextract"])

    # 2. train killed: SIGKILL of the stage at a seeded moment; SIGTERM of the supervisor while it saves.
    log = small / "w" / "logs" / "train.log"
    faults = [
        ("stage", signal.SIGKILL, rng.uniform(1.0, 6.0)),
        ("supervisor", signal.SIGTERM, rng.uniform(0, 0.3)),
    ]
    for number, (target, sig, delay) in enumerate(faults):
        when = f"at +{delay:.1f} s" if target == "stage" else f"+{delay:.2f} s into saving the checkpoint"
        with figures.fault("train", f"{target} {signal_name(sig)} {when}") as fault:
            args, env = argv(small, "train")
            offset = log.stat().st_size if log.is_file() else 0
            proc = start(args, env, log=tmp_path / f"train{number}.log")
            stage = wait_for_child(proc, "draftscope.pipeline exec", timeout=300)
            if target == "stage":
                time.sleep(delay)
                kill_group(stage, sig)
            else:
                deadline = time.monotonic() + 300
                while b"Saving checkpoint" not in (log.read_bytes()[offset:] if log.is_file() else b""):
                    assert proc.poll() is None and time.monotonic() < deadline, "training never saved"
                    time.sleep(0.02)
                time.sleep(delay)
                proc.send_signal(sig)
            proc.wait(timeout=300)
            assert proc.returncode == 1, (tmp_path / f"train{number}.log").read_text()[-3000:]
            facts = record(small, "train")
            expected = ("failed", "killed by SIGKILL") if target == "stage" else ("interrupted", "SIGTERM")
            assert facts["status"] == expected[0] and expected[1] in facts["reason"], facts["reason"]
            assert facts["outputs"] == [], "a checkpoint of a stopped stage was presented as final"
            fault.lose(sum(earlier[s] != b for s, b in records_bytes(small, list(earlier)).items()))
            assert fault.lost == 0, "an earlier stage's record changed"

    with figures.rerun("train", "rerun: train completes with a loadable checkpoint") as rerun:
        proc = run_until_done(small, "train", tmp_path / "train-rerun.log")
        assert proc.returncode == 0, (tmp_path / "train-rerun.log").read_text()[-3000:]
        facts = record(small, "train")
        assert facts["status"] == "completed" and facts["outputs"][0]["sha256"]
        from safetensors import safe_open

        with safe_open(str(small / "w" / "checkpoints" / "0" / "model.safetensors"), framework="pt") as f:
            assert list(f.keys())
        json.loads((small / "w" / "checkpoints" / "0" / "config.json").read_text())
        rerun.lose(sum(earlier[s] != b for s, b in records_bytes(small, list(earlier)).items()))
