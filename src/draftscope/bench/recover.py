"""`invoke recover RUN`: finish the record of a run whose supervisor was killed outright.

Ctrl-C, SIGTERM, a time limit and a full disk all end a run with a final status written by its supervisor. SIGKILL,
the OOM killer or a host crash do not: the manifest stays `running`. Such a run is told from a live one by its
supervisor lock (`rundir.liveness`): nobody holds it. Recovery then

1. takes that lock itself (a second `recover`, or a live supervisor, is refused),
2. stops what the step left behind: the run's containers (by the `draftscope.run` label) or the local step's
   process group — checked to be this run's before it is signalled (on Linux a local step is already gone: it
   received SIGTERM when its supervisor died),
3. cuts a torn last record (a kill mid-write), keeping every complete one,
4. writes the summary from the records kept (`partial`) and the final status `interrupted`, naming what happened.

Nothing is deleted but the torn fragment and the leftover containers; the run keeps its records and logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from draftscope.bench.plan import plan_benchmark
from draftscope.bench.supervisor import finish
from draftscope.core.errors import UserError
from draftscope.core.jsonio import repair_tail
from draftscope.core.provenance import now
from draftscope.core.rundir import FINAL, RECORDS, RunDir, Supervision, liveness
from draftscope.runtime import Outcome

Printer = Callable[[str], None]
FORCE_FIX = "once you are sure nothing of this run still runs, pass --force"


def recover(path: Path, *, force: bool = False, say: Printer = print) -> dict[str, Any]:
    """Finish the run at `path`; returns its final manifest. Refuses (UserError) a live or finished run."""
    run = RunDir.open(path)
    manifest = run.manifest()
    status = manifest["status"]
    if status in FINAL:
        raise UserError(
            f"the run already ended (status '{status}'); there is nothing to recover", source=str(run.path)
        )
    if manifest["kind"] not in ("benchmark", "reproduce"):
        raise UserError(
            f"a '{manifest['kind']}' run is not recovered here",
            source=str(run.path),
            fix="give a benchmark run",
        )
    state = liveness(run.path, status)
    if state.state == "live" and state.info.get("recovering"):
        raise UserError(state.describe(), source=str(run.path), fix="let that recovery finish")
    if state.state == "live":
        pid = state.info.get("pid")
        raise UserError(
            state.describe(),
            source=str(run.path),
            fix=f"stop it with Ctrl-C or `kill -TERM {pid}`: it then records itself as interrupted",
        )
    if state.state == "unknown" and not force:
        raise UserError(
            state.describe(),
            source=str(run.path),
            fix=f"check that no `invoke benchmark` for this run still runs; {FORCE_FIX}",
        )
    supervision = Supervision.adopt(run.path)  # refuses if a second recover got there first
    try:
        info = dict(state.info)
        left = _stop_leftovers(run.path, manifest, info, force=force, say=say)
        cut = repair_tail(run.path / RECORDS)
        run.supervision = supervision
        return _close(run, manifest, info, left, cut)
    finally:
        supervision.release()  # when finishing failed; a no-op after `end`


def _stop_leftovers(
    run: Path, manifest: Mapping[str, Any], info: Mapping[str, Any], *, force: bool, say: Printer
) -> list[str]:
    """Stop the step's work that outlived its supervisor; returns what was done, for the reason."""
    step = info.get("step") or {}
    host = info.get("host")
    here = socket.gethostname()
    engine = step.get("engine") or (
        manifest["config"].get("runtime")
        if manifest["config"].get("runtime") in ("docker", "podman")
        else None
    )
    if host not in (None, here) and (engine or step.get("pgid")) and not force:
        raise UserError(
            f"the run's supervisor ran on host {host}, where its step may still run",
            source=str(run),
            fix=f"run `invoke recover` on {host}; {FORCE_FIX}",
        )
    done: list[str] = []
    if engine:
        done += _remove_containers(engine, manifest["run_id"], force=force, say=say)
    pgid = step.get("pgid")
    if isinstance(pgid, int) and host in (None, here):
        done += _stop_group(pgid, run, force=force, say=say)
    return done


def _remove_containers(engine: str, run_id: str, *, force: bool, say: Printer) -> list[str]:
    listing = _engine(engine, "ps", "--all", "--quiet", "--filter", f"label=draftscope.run={run_id}")
    if listing is None or listing.returncode != 0:
        why = (
            "not installed" if listing is None else (listing.stderr.strip().splitlines() or ["no answer"])[0]
        )
        if force:
            say(f"warning: the {engine} engine could not be asked for the run's containers ({why})")
            return [f"its containers were not checked ({engine}: {why})"]
        raise UserError(
            f"the {engine} engine could not list the run's containers: {why}",
            field="--runtime",
            value=engine,
            fix=f"start the engine (invoke doctor) so its containers can be stopped; {FORCE_FIX}",
        )
    ids = listing.stdout.split()
    for ident in ids:
        say(f"removing container {ident[:12]} left by the run")
        _engine(engine, "rm", "--force", ident)
    return [f"{len(ids)} leftover container(s) removed"] if ids else []


def _engine(engine: str, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([engine, *args], capture_output=True, text=True, timeout=120, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def _stop_group(pgid: int, run: Path, *, force: bool, say: Printer, grace: float = 10.0) -> list[str]:
    if not _alive(pgid):
        return []
    if not _belongs_to(pgid, run):
        if force:
            return [f"process group {pgid} is alive but not recognisably this run's: left alone"]
        raise UserError(
            f"the step's process group {pgid} is alive, and it cannot be confirmed to be this run's",
            source=str(run),
            fix=f"stop it yourself (`kill -TERM -- -{pgid}`) if it is; {FORCE_FIX}",
        )
    say(f"stopping the step's process group {pgid}, which outlived its supervisor")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return [f"the step's process group {pgid} was stopped"]


def _alive(pgid: int) -> bool:
    """Some process of the group still runs. Zombies do not count: a step that received SIGTERM when its supervisor
    died may linger as one where nobody reaps orphans (a container's init that does not)."""
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


def _belongs_to(pgid: int, run: Path) -> bool:
    """The group leader's command line names the run directory (a reused pid would not)."""
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(Path(run).absolute()) in cmdline


def _close(
    run: RunDir, manifest: Mapping[str, Any], info: Mapping[str, Any], left: list[str], cut: int
) -> dict[str, Any]:
    # lazy: bench.reproduce brings analysis.compare and numpy; `recover`'s checks need neither
    from draftscope.bench.reproduce import config_of

    plan = plan_benchmark(config_of(run.path, manifest), str(run.path))
    steps = [dict(s) for s in manifest.get("steps", [])]
    name = (info.get("step") or {}).get("name")
    for entry in steps:
        if entry.get("status") == "running":
            entry.update(status="interrupted", exit_code=None, seconds=None)
            name = name or entry["name"]
    who = f"pid {info['pid']} on {info['host']}" if info.get("pid") else "the supervisor"
    parts = [
        f"the supervisor ({who}) was killed without recording an end (SIGKILL, the OOM killer or a crash)"
        + (f" during step '{name}'" if name else ""),
        f"recovered by `invoke recover` at {now()}",
        *left,
    ]
    if cut:
        parts.append(f"a torn last record ({cut} bytes) was cut")
    outcome = Outcome(name or "benchmark", "interrupted", None, 0.0, "; ".join(parts), None)
    return finish(run, plan, outcome, steps)
