"""The pipeline end to end through `invoke pipeline --runtime local` on a small Qwen3-shaped target (a tokenizer
trained here, a model config, a speculators-format checkpoint): real stages (pretokenize, convert) run by the real
local runtime, schema-valid completion records, reruns that skip, `--force`, and reruns when an input changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from support import INVOKE_PIPELINE, run_invoke

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "unit")
)  # the checkpoint writer of the unit tests
from test_pipeline_convert import checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRESET = """\
schema_version: 1
name: small
display_name: small Qwen3-shaped test target
source: hub
hub: {repo: test/small, revision: 0123456789abcdef0123456789abcdef01234567}
architecture: {kind: dense, model_type: qwen3, num_layers: 4, hidden_size: 64, vocab_size: 512,
               max_position_embeddings: 512}
dflash: {block_size: 4, decay_gamma: 4, target_layer_ids: [1, 2], num_draft_layers: 2, mask_token_id: 511}
training: {seq_length: 128, max_anchors: 16, nproc_per_node: 1}
serving: {tp_size: 1}
status: {tested: false}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import inspect

    from draftscope.tiny import tokenizer as T

    root = tmp_path_factory.mktemp("pipe")
    (root / "presets" / "models").mkdir(parents=True)
    (root / "presets" / "models" / "small.yaml").write_text(PRESET)
    model = root / "model"
    T.save_tokenizer(T.wrap(T.train_tokenizer([inspect.getsource(json)] * 3, vocab_size=512)), model)
    (model / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 512})
    )
    chat = root / "chat.jsonl"
    rows = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"answer {i}"},
            ],
        }
        for i in range(6)
    ]
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def run(setup: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRAFTSCOPE_PRESETS": str(setup / "presets")}
    args = [
        "pipeline",
        "--preset",
        "small",
        "--draft",
        "dflash",
        "--runtime",
        "local",
        "--workdir",
        str(workdir),
        "--stage",
        "pretokenize,convert",
        "--opts",
        f"model_path={setup / 'model'}",
        "--opts",
        f"data.chat={setup / 'chat.jsonl'}",
        "--opts",
        "convert.mask_probe=false",  # a hand-written checkpoint, no speculators here: test_pipeline_speculators probes
        *extra,
    ]
    return subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_local_stages_run_record_skip_and_rerun(setup, tmp_path):
    workdir = tmp_path / "w"
    checkpoint(
        workdir, "dflash"
    )  # what the train stage leaves: <save>/<epoch>/{config.json, model.safetensors}
    first = run(setup, workdir)
    assert first.returncode == 0, first.stdout + first.stderr
    for stage in ("pretokenize", "convert"):
        record = read_json(workdir / "stages" / f"{stage}.json")
        assert problems(record, "stage-record") == [], stage
        assert record["status"] == "completed" and record["runtime"] == "local"
        assert record["versions"]["draftscope"] and record["seconds"] > 0
        assert all(len(i["sha256"]) == 64 for i in record["inputs"])
        assert record["argv"][1:4] == ["-m", "draftscope.pipeline", stage]
    assert read_json(workdir / "stages" / "pretokenize.json")["counts"]["rows"] == 6
    assert problems(read_json(workdir / "pretokenize" / "stats.json"), "stage-pretokenize") == []
    converted = read_json(workdir / "draft" / "config.json")
    assert converted["architectures"] == ["DFlashDraftModel"]
    assert converted["dflash_config"]["target_layer_ids"] == [1, 2]
    assert (workdir / "pipeline.json").is_file() and (workdir / "logs" / "convert.log").is_file()

    again = run(setup, workdir)
    assert again.returncode == 0
    assert "pretokenize: skipped" in again.stdout and "convert: skipped" in again.stdout

    forced = run(setup, workdir, "--force")
    assert forced.returncode == 0 and "skipped" not in forced.stdout

    chat = setup / "chat.jsonl"
    original = chat.read_text()
    try:
        chat.write_text(
            original
            + json.dumps(
                {
                    "id": "new",
                    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                }
            )
            + "\n"
        )
        changed = run(setup, workdir)
    finally:
        chat.write_text(original)
    assert changed.returncode == 0
    assert "pretokenize: completed" in changed.stdout and "convert: skipped" in changed.stdout
    assert read_json(workdir / "stages" / "pretokenize.json")["counts"]["rows"] == 7
    assert len((workdir / "invocations.jsonl").read_text().splitlines()) == 4


def test_validate_checks_a_workdirs_records_outputs_and_their_hashes_where_it_lies_now(
    setup, tmp_path, monkeypatch
):
    workdir = tmp_path / "w"
    checkpoint(workdir, "dflash")
    assert run(setup, workdir).returncode == 0
    # A reviewer's copy: the plan is rebuilt where the workdir is now.
    moved = workdir.rename(tmp_path / "moved")
    env = {"DRAFTSCOPE_PRESETS": str(setup / "presets")}
    checked = run_invoke("validate", str(moved), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    for expected in (
        "ok   pipeline.json (pipeline-config)",
        "ok   stages/pretokenize.json (stage-record)",
        "ok   pretokenize/rows.jsonl",
        "ok   pretokenize/stats.json (stage-pretokenize)",
        "ok   draft/draftscope-convert.json (stage-convert)",
        "ok   stages/convert.result.json (stage-result)",
    ):
        assert expected in lines, checked.stdout
    assert lines[-1] == f"{moved}: all {len(lines) - 1} file(s) valid"
    from draftscope.ops.validate import validate_path

    monkeypatch.setenv("DRAFTSCOPE_PRESETS", env["DRAFTSCOPE_PRESETS"])
    monkeypatch.chdir(tmp_path)  # typed relative to the current folder: the same verdicts
    assert [v.line() for v in validate_path(Path("moved")).verdicts] == lines[:-1]

    with (moved / "pretokenize" / "rows.jsonl").open("a") as handle:
        handle.write("{}\n")
    (moved / "draft" / "config.json").unlink()
    (moved / "stages" / "convert.result.json").write_text('{"schema_version": 1, "stage": "convert"}')
    bad = run_invoke("validate", str(moved), env=env)
    assert bad.returncode == 1
    failed = [line for line in bad.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 3, bad.stdout
    assert failed[0].startswith("FAIL pretokenize/rows.jsonl: changed since stage pretokenize completed")
    assert failed[1] == "FAIL draft/config.json: missing: stage convert recorded it as output 'config'"
    assert failed[2].startswith("FAIL stages/convert.result.json (stage-result): $: 'counts' is required")
    assert f"{moved}: 3 of " in bad.stderr


def test_a_refused_checkpoint_fails_the_stage_with_the_field_in_its_record(setup, tmp_path):
    workdir = tmp_path / "w"
    checkpoint(workdir, "dflash", block_size=8)
    result = run(setup, workdir)
    assert result.returncode == 1
    record = read_json(workdir / "stages" / "convert.json")
    assert record["status"] == "failed" and problems(record, "stage-record") == []
    log = (workdir / "logs" / "convert.log").read_text()
    assert "block_size: expected 4, found 8" in log


def test_a_missing_input_is_refused_before_the_stage_starts(setup, tmp_path):
    result = run(setup, tmp_path / "w")  # no checkpoint: convert has nothing to read
    assert result.returncode == 2
    assert "needs checkpoints" in result.stderr and result.stderr.strip().count("\n") == 0


def test_gpu_stages_and_missing_stage_inputs_are_refused_before_anything_is_written(setup, tmp_path):
    env = {**os.environ, "DRAFTSCOPE_PRESETS": str(setup / "presets")}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            INVOKE_PIPELINE,
            "pipeline",
            "--preset",
            "small",
            "--runtime",
            "local",
            "--workdir",
            str(tmp_path / "w"),
            "--stage",
            "serve",
            "--opts",
            f"model_path={setup / 'model'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "stage serve needs draft config" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert not (tmp_path / "w").exists()
    from draftscope.core.hardware import nvidia_gpus_present

    if nvidia_gpus_present():
        return  # the rest checks the refusal on a machine without a GPU
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "draft").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "d" / "draft" / name).write_text("{}")
    before = sorted(p.name for p in (tmp_path / "d").rglob("*"))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            INVOKE_PIPELINE,
            "pipeline",
            "--preset",
            "small",
            "--runtime",
            "local",
            "--workdir",
            str(tmp_path / "d"),
            "--stage",
            "serve",
            "--opts",
            f"model_path={setup / 'model'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        result.returncode == 2 and "stage serve needs an NVIDIA GPU" in result.stderr
    )  # no GPU on CI machines
    assert sorted(p.name for p in (tmp_path / "d").rglob("*")) == before
