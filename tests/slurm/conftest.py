"""A real single-node Slurm cluster for the `slurm` tests: started once per session by
images/local/slurm-cluster.sh (munge + slurmctld + slurmd from the Debian packages, no systemd) and stopped at the
end, after which nothing of it may still run. A cluster that was already up is used and left up."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import ROOT, unavailable

SCRIPT = ROOT / "images" / "local" / "slurm-cluster.sh"
DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")
PID_FILES = ("/run/slurmctld.pid", "/run/slurmd.pid", "/run/munge/munged.pid")
INSTALL = (
    "images/local/slurm-cluster.sh install (root; apt-get install --no-install-recommends slurmctld slurmd "
    "slurm-client munge)"
)


def running(names: tuple[str, ...] = DAEMONS) -> list[str]:
    """Live processes (not zombies: PID 1 here reaps orphans late) with one of these command names."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if comm in names and state != "Z":
            found.append(f"{comm}[{entry.name}]")
    return found


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(c) is None]
    if missing:
        unavailable(f"Slurm is not installed here (no {', '.join(missing)}): {INSTALL}")
    if os.geteuid() != 0:
        unavailable("starting a Slurm cluster (munged, slurmctld, slurmd) needs root")
    was_up = bool(running(("slurmctld",))) and bool(running(("slurmd",)))
    if not was_up:
        started = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
    yield
    if was_up:
        return
    stopped = subprocess.run([str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running() == [], "the cluster's teardown left daemons running"
    assert [p for p in PID_FILES if Path(p).exists()] == [], "the teardown left pid files"
