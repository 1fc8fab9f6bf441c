"""`supervise`: a client is waited for within its limit; one that outlives the work it attached to (a container
already exited, as the engine says) is stopped after a grace instead of hanging the run until its time limit."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from draftscope.runtime import base


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(base, "POLL_S", 0.05)


def client(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_client_outliving_its_finished_work_is_stopped_after_the_grace():
    proc, stopped, asked = client(60), [], []
    start = time.monotonic()
    state = base.supervise(
        proc,
        max_seconds=30,
        stop=lambda: stopped.append(1),
        started=start,
        finished=lambda: asked.append(1) or True,
        linger=0.3,
    )
    assert state == ("exited", None) and proc.poll() is not None and stopped == []
    assert 0.3 <= time.monotonic() - start < 10 and asked


def test_a_client_whose_work_goes_on_runs_into_its_limit():
    proc, stopped = client(60), []
    start = time.monotonic()
    state, reason = base.supervise(
        proc,
        max_seconds=0.5,
        stop=lambda: (stopped.append(1), proc.kill()),
        started=start,
        finished=lambda: False,
        linger=0.1,
    )
    assert state == "timed_out" and "time limit of 0.5 s" in reason and stopped == [1]


def test_a_client_that_ends_is_not_asked_about_its_work():
    proc, asked = client(0), []
    assert base.supervise(
        proc,
        max_seconds=None,
        stop=lambda: None,
        started=time.monotonic(),
        finished=lambda: asked.append(1) or False,
    ) == (
        "exited",
        None,
    )
    assert proc.returncode == 0
