"""Faults injected into the kit's durable writes themselves (`draftscope.core.jsonio`, `draftscope.core.rundir`): a writer
process killed between an atomic write's fsync and its rename, killed at seeded random moments while it rewrites a
JSON file or appends JSON Lines records, and refused space by a full disk mid-record. Readers must always see a
whole old or whole new file, every record appended before the kill, and no torn line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from draftscope.core.jsonio import JsonlAppender, atomic_write_json, read_json
from draftscope.core.rundir import RunDir
from draftscope.core.validate import validate_run
from draftscope.pipeline.state import write_record

from faultlib import lost_from, read_lines
from support import unavailable

pytestmark = pytest.mark.reliability

CONFIG = {"schema_version": 1, "name": "rel", "backend": "transformers", "model_preset": "tiny"}


def in_child(work: Callable[[], None]) -> int:
    """Run `work` in a forked child; return its pid (the child never returns into pytest)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def kill_before_rename(work: Callable[[], None]) -> int:
    """`work` in a child whose first rename kills it: the new content is written and fsynced, not yet renamed."""

    def patched() -> None:
        os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)
        work()

    _, status = os.waitpid(in_child(patched), 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def test_kill_between_write_and_rename_keeps_the_old_file(tmp_path, figures):
    run = RunDir.create(tmp_path / "r1", kind="benchmark", config=CONFIG, argv=["t"])
    run.set_status("running")
    stage_record = {
        "schema_version": 1,
        "stage": "regen",
        "status": "failed",
        "reason": "x",
        "draft": "dflash",
        "model_preset": "tiny",
        "runtime": "local",
        "argv": ["python"],
        "commands": [],
        "image": {"name": "vllm", "reference": None, "id": None, "repo_digests": []},
        "config_sha256": "0" * 64,
        "inputs": [],
        "outputs": [],
        "versions": {},
        "counts": {},
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z",
        "seconds": 1.0,
        "notes": [],
    }
    write_record(run.path, {**stage_record, "reason": "the first attempt"})
    cases = {
        "manifest: status update": (run.manifest_path, lambda: run.set_status("failed", "x")),
        "manifest: a note": (run.manifest_path, lambda: run.note("a note")),
        "pipeline stage record": (
            run.path / "stages" / "regen.json",
            lambda: write_record(run.path, stage_record),
        ),
        "summary.json: first write": (
            run.path / "summary.json",
            lambda: atomic_write_json(run.path / "summary.json", {"a": 1}),
        ),
        "worker.json: rewrite": (
            run.path / "worker.json",
            lambda: atomic_write_json(run.path / "worker.json", {"phase": "done"}),
        ),
    }
    atomic_write_json(run.path / "worker.json", {"phase": "loading"})
    for what, (path, work) in cases.items():
        before = path.read_bytes() if path.exists() else None
        with figures.fault("atomic-write", f"SIGKILL between write and rename: {what}"):
            assert kill_before_rename(work) == signal.SIGKILL
            after = path.read_bytes() if path.exists() else None
            assert after == before, "the file changed although the rename never happened"
            assert validate_run(run.path).ok
            assert run.manifest()["status"] == "running"


def test_kill_at_random_moments_while_rewriting(tmp_path, figures, seed):
    rng = random.Random(f"{seed}:atomic")
    path = tmp_path / "state.json"
    atomic_write_json(path, {"version": 0, "pad": ""})
    for _ in range(6):
        delay = rng.uniform(0.005, 0.05)
        with figures.fault("atomic-write", f"SIGKILL at +{delay * 1000:.0f} ms while rewriting a JSON file"):
            start = read_json(path)["version"]

            def rewrite(start: int = start) -> None:
                for v in range(start + 1, start + 100_000):
                    atomic_write_json(path, {"version": v, "pad": "x" * (v % 5000)})

            pid = in_child(rewrite)
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            data = read_json(path)  # whole, or this raises
            assert data["version"] >= start and data["pad"] == "x" * (data["version"] % 5000)


def test_kill_at_random_moments_while_appending(tmp_path, figures, seed):
    rng = random.Random(f"{seed}:jsonl")
    path = tmp_path / "records.jsonl"
    for _ in range(6):
        delay = rng.uniform(0.005, 0.05)
        with figures.fault(
            "atomic-write", f"SIGKILL at +{delay * 1000:.0f} ms while appending records"
        ) as fault:

            def append() -> None:
                with JsonlAppender(path) as out:
                    for i in range(1_000_000):
                        out.append({"i": i, "pad": "y" * (i % 3000)})

            pid = in_child(append)
            time.sleep(delay)
            before = read_lines(path)[0]
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            after, torn = read_lines(path)
            fault.tear(torn)
            fault.lose(lost_from(before, after))
            assert torn == 0 and len(after) >= len(before)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_mid_record_leaves_no_torn_line(small_disk, figures):
    path = small_disk / "records.jsonl"
    with figures.fault("atomic-write", "disk full while appending (256 KiB tmpfs)") as fault:
        written = 0
        with JsonlAppender(path) as out, pytest.raises(OSError) as exc:
            while True:  # records of ~7 KB: the last one meets the end of the disk part-way
                out.append({"i": written, "pad": "z" * 7000})
                written += 1
        assert exc.value.errno == 28, exc.value  # ENOSPC
        lines, torn = read_lines(path)
        fault.tear(torn)
        fault.lose(written - len(lines))
        assert torn == 0 and [json.loads(line)["i"] for line in lines] == list(range(written))
