"""How a stopped benchmark ends when stopping is not simple: the step's process group outlived the supervised wait,
or finishing the run outlasted its bound. The run is then left for `invoke recover` with the true story (in the
manifest's notes and in the lock file `recover` reads), never a guess."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.rundir import RunDir, Supervision


def signal_words(signum: int | None) -> str:
    if signum == signal.SIGTERM:
        return "terminated (SIGTERM)"
    if signum == signal.SIGINT:
        return "interrupted by the user (Ctrl-C)"
    return "stopped"


def stop_leftover_step(supervision: Supervision | None, grace: float) -> str | None:
    """The local step's process group must be gone before the run is finished (a Ctrl-C can land between its start
    and the supervised wait). Stopped here if not; a sentence when even SIGKILL did not end it in time."""
    pgid = ((supervision.info.get("step") or {}) if supervision else {}).get("pgid")
    if not isinstance(pgid, int) or not group_alive(pgid):
        return None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace + 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_alive(pgid):
            return None
    return f"the step's process group {pgid} did not end within {grace + 10.0:g} s of SIGKILL"


def group_alive(pgid: int) -> bool:
    """Some process of the group still runs. Zombies do not count: they write nothing, and a step that received
    SIGTERM when its supervisor died may linger as one where nobody reaps orphans (a container's init that does not).
    `invoke recover` asks the same."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
    return False


def expired(run: RunDir, supervision: Supervision | None, signum: int, bound: float) -> None:
    """The watchdog's last word (another thread; the main one is stuck): the lock file, then one line."""
    text = (
        f"{signal_words(signum)}; stopping the step and finishing the run took longer than {bound:g} s; "
        "the run was left unfinished for `invoke recover`"
    )
    if supervision is not None:
        with contextlib.suppress(OSError):
            supervision.stopping(text)
    print(f"{run.path}: left unfinished ({text})", file=sys.stderr, flush=True)


def unfinished(run: RunDir, supervision: Supervision | None, signum: int | None, why: str) -> dict[str, Any]:
    """Leave the run for `invoke recover`, its true story written down: in the manifest's notes and in the lock file
    (which `recover` reads), the lock let go but its file kept. Returns the manifest as it stands."""
    text = f"{signal_words(signum)}; {why}; the run was left unfinished for `invoke recover`"
    if supervision is not None:
        with contextlib.suppress(OSError):
            supervision.stopping(text)
    with contextlib.suppress(OSError, UserError, ValueError):
        run.note(text)
    if supervision is not None:
        supervision.release()
    try:
        manifest = run.manifest()
    except (OSError, UserError, ValueError):
        manifest = {"status": "running"}
    return {**manifest, "reason": text}
