"""Helpers of the reliability tier (import as `from faultlib import …`): processes, kill points, JSON Lines checks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from support import INVOKE_PIPELINE, free_port, port_is_free  # noqa: F401 - used by the fault tests

ROOT = Path(__file__).resolve().parents[2]
# Keep concurrent CPU runs from oversubscribing the two cores (the runtime passes it on by name).
QUIET_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def invoke_argv(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "invoke", *args]


def pipeline_argv(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-c", INVOKE_PIPELINE, "pipeline", *args]


def start(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, **QUIET_ENV, **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    poll: float = 0.02,
    alive: subprocess.Popen | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the process ended (code {alive.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def children(pid: int) -> list[int]:
    """Direct children of `pid`, over all its threads."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        return []
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def child_running(parent: int, needle: str) -> int | None:
    for pid in children(parent):
        if needle in cmdline(pid):
            return pid
    return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_group(pid: int, sig: int) -> None:
    """Signal the process group `pid` leads (the local runtime starts each step in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def wait_for_child(proc: subprocess.Popen, needle: str, timeout: float = 120) -> int:
    """The pid of `proc`'s child whose command line holds `needle`, once it has started."""
    deadline = time.monotonic() + timeout
    while True:
        pid = child_running(proc.pid, needle)
        if pid is not None:
            return pid
        if proc.poll() is not None:
            raise AssertionError(f"the process ended (code {proc.returncode}) before {needle!r} started")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {needle!r} to start")
        time.sleep(0.02)


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name


# --- JSON Lines ---------------------------------------------------------------------------------------------------


def read_lines(path: Path) -> tuple[list[bytes], int]:
    """(complete lines, torn lines): a torn line lacks its newline or is not JSON."""
    if not path.is_file():
        return [], 0
    data = path.read_bytes()
    parts = data.split(b"\n")
    tail = parts.pop()  # b"" when the file ends with a newline
    torn = 1 if tail else 0
    good = []
    for line in parts:
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            torn += 1
            continue
        good.append(line)
    return good, torn


def complete_lines(path: Path) -> list[bytes]:
    return read_lines(path)[0]


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen, timeout: float = 180) -> list[bytes]:
    """Wait until `path` holds at least `count` complete lines (while `proc` runs); return them."""
    deadline = time.monotonic() + timeout
    while len(lines := complete_lines(path)) < count:
        if proc.poll() is not None:
            raise AssertionError(
                f"the process ended (code {proc.returncode}) before {count} lines were written"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {count} lines in {path.name}")
        time.sleep(0.02)
    return lines


def lost_from(before: Iterable[bytes], after: Iterable[bytes]) -> int:
    """Lines seen before the fault that are not, byte for byte, in the file after it."""
    remaining = set(after)
    return sum(1 for line in before if line not in remaining)


def duplicates(values: Iterable[str]) -> int:
    seen: set[str] = set()
    dup = 0
    for v in values:
        dup += v in seen
        seen.add(v)
    return dup


# --- secrets ------------------------------------------------------------------------------------------------------


def search(folder: Path, needles: Iterable[str]) -> tuple[list[str], int]:
    """(hits as 'file: needle', files searched) over every file under `folder`, as bytes."""
    needles = [n.encode() for n in needles]
    hits, files = [], 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        files += 1
        data = path.read_bytes()
        hits += [f"{path}: {n.decode()[:12]}…" for n in needles if n in data]
    return hits, files
