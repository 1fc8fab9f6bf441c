"""regen on the tiny preset, for real: `invoke pipeline --runtime local` starts the kit's loopback chat server with
the tiny target, the client regenerates the example chat rows, and the stage survives being stopped midway —
by Ctrl-C through the supervisor, and by SIGKILL of the whole stage (servers included) with a torn last line —
finishing on the rerun with `ok + errors == input` and no row twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from support import child_pids, free_port, port_is_free, regen_output_ids, tiny_regen_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def pipeline_argv(workdir: Path, port: int, *opts: str) -> list[str]:
    return tiny_regen_argv(workdir, f"regen.base_port={port}", "regen.concurrency=2", *opts)


def wait_for_rows(workdir: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(regen_output_ids(workdir)) < count:
        assert proc.poll() is None, "the stage ended before it was stopped"
        assert time.monotonic() < deadline, "no rows appeared"
        time.sleep(0.1)


def assert_complete(workdir: Path, rows: int) -> dict:
    ids = regen_output_ids(workdir)
    assert len(ids) == len(set(ids)), "a row was written twice"
    summary = read_json(workdir / "regen" / "summary.json")
    assert problems(summary, "stage-regen") == []
    assert summary["input"] == rows and summary["ok"] + summary["errors"] == rows and summary["missing"] == []
    assert summary["ok"] == len(ids)
    return summary


def test_regen_runs_records_and_skips(tmp_path):
    workdir, port = tmp_path / "w", free_port()
    first = subprocess.run(
        pipeline_argv(workdir, port, "data.max_rows=12"), capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stdout + first.stderr
    summary = assert_complete(workdir, 12)
    assert summary["errors"] == 0 and summary["instances"][0]["rows"] == 12
    record = read_json(workdir / "stages" / "regen.json")
    assert problems(record, "stage-record") == [] and record["status"] == "completed"
    assert record["counts"]["ok"] == 12 and record["commands"][0]["argv"][3] == "tinyserve"
    row = json.loads((workdir / "regen" / "rows.jsonl").read_text().splitlines()[0])
    assert row["messages"][-1]["role"] == "assistant" and row["regen"]["completion_tokens"] > 0
    assert (workdir / "logs" / "regen.server-0.log").is_file() and port_is_free(port)
    again = subprocess.run(
        pipeline_argv(workdir, port, "data.max_rows=12"), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "regen: skipped" in again.stdout


def test_ctrl_c_midway_then_rerun_accounts_for_every_row(tmp_path):
    workdir, port = tmp_path / "w", free_port()
    argv = pipeline_argv(workdir, port, "data.max_rows=40", "regen.max_tokens=96")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_rows(workdir, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert read_json(workdir / "stages" / "regen.json")["status"] == "interrupted"
    before = regen_output_ids(workdir)
    assert 3 <= len(before) < 40 and port_is_free(port)

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = assert_complete(workdir, 40)
    assert summary["ok"] == 40 and regen_output_ids(workdir)[: len(before)] == before
    assert read_json(workdir / "stages" / "regen.json")["counts"]["resumed"] == len(before)


def test_sigkill_of_supervisor_and_stage_then_rerun_repairs_and_resumes(tmp_path):
    """Everything killed at once — the host process, the stage and its server (an OOM kill or a lost node) — with
    the last output line cut short: the rerun repairs the file, resumes, and no row is written twice."""
    workdir, port = tmp_path / "w", free_port()
    argv = pipeline_argv(workdir, port, "data.max_rows=30", "regen.max_tokens=96")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_rows(workdir, 3, proc)
    (stage,) = child_pids(proc.pid)  # the local runtime runs the stage in a session of its own
    os.kill(proc.pid, signal.SIGKILL)
    os.killpg(stage, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not port_is_free(port):  # the server died with the stage's process group
        assert time.monotonic() < deadline, "the server outlived its stage"
        time.sleep(0.2)
    with (workdir / "regen" / "rows.jsonl").open("a") as handle:
        handle.write('{"id": "chat-029", "messages": [{"role": "us')  # a write cut short
    done = regen_output_ids(workdir)
    assert not (workdir / "stages" / "regen.json").exists()  # the host died before it could record anything

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"{len(done)} done before" in (workdir / "logs" / "regen.log").read_text()
    summary = assert_complete(workdir, 30)
    assert summary["ok"] == 30
