"""A full disk, for real: the run directory on a small tmpfs that another process fills while the benchmark runs,
and a tmpfs too small to hold a new run at all. The run must end `failed` with a reason that names the full disk,
keep every record written before (no torn line), and present nothing half-written as final; a run that cannot
be set up leaves nothing behind."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.validate import validate_run

from faultlib import invoke_argv, lost_from, read_lines, start, wait_for_lines
from support import run_invoke, tiny_benchmark, unavailable

pytestmark = pytest.mark.reliability

TINY = tiny_benchmark("local", "--repeats", "3", "--max-new-tokens", "32", "--warmups", "0")


def mount_tmpfs(path, size: str):
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    return path


@pytest.fixture
def disk(tmp_path):
    yield mount_tmpfs(tmp_path / "disk", "4m")
    subprocess.run(["umount", "-l", str(tmp_path / "disk")], check=False)


def fill(folder) -> int:
    """Take every free byte of the file system holding `folder`; returns the bytes taken."""
    taken = 0
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            while True:
                try:
                    written = os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
                taken += written
                if written < chunk:
                    break
    finally:
        os.close(fd)
    return taken


def test_disk_filled_during_a_run(disk, tmp_path, figures):
    run = disk / "run"
    with figures.fault("benchmark", "disk filled by another process during the run") as fault:
        proc = start(invoke_argv(*TINY, "--output", str(run)), log=tmp_path / "run.log")
        try:
            before = wait_for_lines(run / "records.jsonl", 2, proc)
            fill(disk)
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        output = (tmp_path / "run.log").read_text()
        after, torn = read_lines(run / "records.jsonl")
        fault.tear(torn)
        fault.lose(lost_from(before, after))
        assert proc.returncode == 1, output[-2000:]
        manifest = read_json(run / "manifest.json")
        assert manifest["status"] == "failed", manifest["reason"]
        assert "no space left" in manifest["reason"], manifest["reason"]
        assert "failed (no space left" in output  # the one line the user sees says it too
        summary = read_json(run / "summary.json")
        assert summary["partial"] is True and summary["records"] == len(after)
        report = validate_run(run)
        assert report.ok, report.first_failure()
        assert not list(run.glob(".*.tmp")), "a half-written temporary file was left behind"


def test_a_disk_too_small_for_a_run_leaves_nothing(tmp_path, figures):
    disk = mount_tmpfs(tmp_path / "small", "512k")
    try:
        with figures.fault("benchmark", "disk full while the run directory is set up"):
            result = run_invoke(*TINY, "--output", str(disk / "run"), timeout=120)
            assert result.returncode == 2, result.stdout + result.stderr
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("error: --output:") and "No space left on device" in line, line
            assert not (disk / "run").exists() and "Traceback" not in result.stderr
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
