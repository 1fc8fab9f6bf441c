"""Two invocations on the same output at once: exactly one proceeds, the other is refused with one line and
changes nothing."""

from __future__ import annotations

import json

import pytest

from draftscope.core.validate import validate_run

from faultlib import duplicates, free_port, invoke_argv, pipeline_argv, read_lines, start
from support import tiny_benchmark

pytestmark = pytest.mark.reliability

TINY = tiny_benchmark("local", "--repeats", "1", "--max-new-tokens", "8", "--warmups", "0")


def test_two_benchmarks_into_one_run_directory(tmp_path, figures):
    run = tmp_path / "run"
    with figures.fault("concurrent", "two benchmarks started at once into the same --output") as fault:
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        procs = [start(invoke_argv(*TINY, "--output", str(run)), log=log) for log in logs]
        codes = sorted(p.wait(timeout=300) for p in procs)
        assert codes == [0, 2], [log.read_text()[-1500:] for log in logs]
        refused = next(log.read_text() for log, p in zip(logs, procs, strict=True) if p.returncode == 2)
        (line,) = refused.strip().splitlines()
        assert line.startswith("error: --output:") and "already exists" in line
        lines, torn = read_lines(run / "records.jsonl")
        fault.tear(torn)
        fault.lose(12 - len(lines))
        assert len(lines) == 12, "records from both invocations, or missing ones"
        assert json.loads((run / "manifest.json").read_text())["status"] == "completed"
        assert validate_run(run).ok


def test_two_pipelines_on_one_workdir(tmp_path):
    workdir = tmp_path / "w"
    argv = [
        "--preset",
        "tiny",
        "--runtime",
        "local",
        "--stage",
        "regen",
        "--workdir",
        str(workdir),
        "--opts",
        "data.max_rows=8",
        "--opts",
        "regen.max_tokens=8",
        "--opts",
        "regen.concurrency=2",
    ]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [start(pipeline_argv(*argv, "--opts", f"regen.base_port={free_port()}"), log=log) for log in logs]
    codes = sorted(p.wait(timeout=300) for p in procs)
    lines, torn = read_lines(workdir / "regen" / "rows.jsonl")
    assert torn == 0 and duplicates(json.loads(line)["id"] for line in lines) == 0
    assert codes[0] == 0 and codes[1] != 0, "exactly one invocation proceeds"
    refused = next(log for log, p in zip(logs, procs, strict=True) if p.returncode != 0).read_text()
    assert "another invocation is working in this workdir" in refused and "Traceback" not in refused
