"""`invoke benchmark` end to end on the kit-built tiny models, CPU, local runtime (issue acceptance 1–6)."""

import json
import time

import pytest

from support import ROOT, run_invoke, tiny_benchmark, wall_bound

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = tiny_benchmark("local")


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def records(run):
    lines = (run / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "R1"
    result = run_invoke(*TINY, "--output", str(out), "--repeats", "3", "--max-new-tokens", "48", timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "R2"
    result = run_invoke(
        *TINY,
        "--output",
        str(out),
        "--repeats",
        "1",
        "--max-new-tokens",
        "48",
        "--draft",
        "tiny",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return out


def test_plain_run_completes_validates_and_agrees(plain_run):
    manifest = json.loads((plain_run / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["reason"] is None
    assert manifest["images"][0]["runtime"] == "local"
    assert manifest["software"]["worker"]["torch"] and manifest["hardware"]["device"] == "cpu"
    result = run_invoke("validate", str(plain_run))
    assert result.returncode == 0, result.stdout
    summary = json.loads((plain_run / "summary.json").read_text())
    assert summary["greedy_agreement"] is True and summary["disagreements"] == []
    assert summary["records"] == 36 and summary["prompts_completed"] == 12
    assert summary["overall"]["decode_tok_s"]["median"] > 0
    for r in records(plain_run):
        assert len(r["token_timestamps"]) == r["generated_tokens"]
        assert r["token_timestamps"] == sorted(r["token_timestamps"])


def test_existing_output_is_refused_and_unchanged(plain_run):
    before = snapshot(plain_run)
    result = run_invoke(*TINY, "--output", str(plain_run), "--repeats", "1")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "already exists" in line and "--output" in line
    assert snapshot(plain_run) == before


def test_speculative_tokens_equal_plain_greedy(plain_run, spec_run):
    plain = {r["prompt_id"]: r["generated_token_ids"] for r in records(plain_run) if r["repeat"] == 0}
    spec = records(spec_run)
    assert len(spec) == 12
    for r in spec:
        assert r["generated_token_ids"] == plain[r["prompt_id"]], r["prompt_id"]
        assert r["acceptance_lengths"] and sum(r["acceptance_lengths"]) == r["generated_tokens"]
        assert r["draft_tokens_per_step"] == 4
    summary = json.loads((spec_run / "summary.json").read_text())
    assert summary["overall"]["acceptance_length"]["median"] >= 1
    assert 0 <= summary["overall"]["acceptance_rate"] <= 1


def test_time_limit_kills_and_keeps_a_valid_partial_run(tmp_path):
    out = tmp_path / "R3"
    start = time.monotonic()
    result = run_invoke(
        *TINY, "--output", str(out), "--fixed-tokens", "100000", "--max-seconds", "5", timeout=60
    )
    elapsed = time.monotonic() - start
    assert elapsed < wall_bound(15), elapsed
    assert result.returncode == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "timed_out" and "time limit of 5 s" in manifest["reason"]
    for line in (out / "records.jsonl").read_text().splitlines():
        json.loads(line)
    assert run_invoke("validate", str(out)).returncode == 0
    assert json.loads((out / "summary.json").read_text())["partial"] is True


@pytest.mark.parametrize(
    "extra",
    [["--model", "Org/Name"], ["--model", "Org/Name", "--revision", "abc1234"]],
    ids=["no-revision", "short-revision"],
)
def test_custom_model_needs_a_full_revision(tmp_path, extra):
    result = run_invoke(*TINY, "--output", str(tmp_path / "R"), *extra)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error:") and "revision" in line and "fix:" in line
    assert not (tmp_path / "R").exists()


def test_vllm_dry_run_prints_the_container_command_without_torch(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    result = run_invoke(
        "benchmark",
        "--backend",
        "vllm",
        "--int4-dflash",
        "--dry-run",
        env={"PYTHONPATH": str(tmp_path / "fake")},
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "imported").exists()
    out = result.stdout
    for needle in (
        "localhost/draftscope-vllm",
        "--gpus all",
        "target=/draftscope/run",
        "target=/draftscope/cache/huggingface,readonly",
        "RedHatAI/Qwen3.8-27B-INT4",
        "z-lab/Qwen3.8-27B-DFlash2",
        "--network none",
    ):
        assert needle in out, needle


def test_ctrl_c_marks_the_run_interrupted(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "R5"
    proc = subprocess.Popen(
        [sys.executable, "-m", "invoke", *TINY, "--output", str(out), "--fixed-tokens", "100000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        manifest = out / "manifest.json"
        if manifest.exists() and json.loads(manifest.read_text())["status"] == "running":
            break
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "interrupted" and "Ctrl-C" in m["reason"]
    assert run_invoke("validate", str(out)).returncode == 0


def test_overhead_benchmark_prints_ratios():
    result = run_invoke("bench-overhead", "--tokens", "16", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "kit / bare      = " in result.stdout and "goal < 1%" in result.stdout
