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

The lock and the manifest are read from the run directory, which anyone may have edited: no program they name is
run (only the container engines the kit drives, found on PATH by the kit's name for them), a process group is
signalled only on the host that ran it and only once it is shown to be this run's step, and the files recovery
writes are refused when they are links (`lock_facts`, draftscope.core.untrusted).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from draftscope.bench.plan import Plan, plan_benchmark
from draftscope.bench.stopping import group_alive
from draftscope.bench.supervisor import finish
from draftscope.core import schema as schemas
from draftscope.core.errors import UserError
from draftscope.core.jsonio import repair_tail
from draftscope.core.provenance import now
from draftscope.core.rundir import (
    FINAL,
    MANIFEST,
    RECORDS,
    RESERVE,
    SUPERVISOR,
    RunDir,
    Supervision,
    liveness,
)
from draftscope.core.untrusted import ENGINES, check_file, check_run_id, engine_program
from draftscope.runtime import Outcome

Printer = Callable[[str], None]
FORCE_FIX = "once you are sure nothing of this run still runs, pass --force"
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")  # what `ps --quiet` prints; anything else is not passed to `rm`


LOCK_FIX = (
    f"the lock is not one the kit wrote: make sure nothing of this run still runs, delete {SUPERVISOR} and pass "
    "--force"
)
PID_MAX = 1 << 22  # Linux's largest pid_max: a larger number is no process


def recover(path: Path, *, force: bool = False, say: Printer = print) -> dict[str, Any]:
    """Finish the run at `path`; returns its final manifest. Refuses (UserError) a live or finished run.

    Everything read from the run is checked before it is used (draftscope.core.untrusted): the manifest against
    its schema, the lock's facts for their types, its engine against the engines the kit drives; the files that
    recovery writes must be regular files of the run, not links (a link would redirect the write)."""
    run = RunDir.open(path)
    for rel in (MANIFEST, RECORDS, SUPERVISOR, "worker.json", RESERVE):
        check_file(run.path, rel, links=False)
    manifest = run.manifest()
    schemas.check(manifest, "run-manifest", str(run.manifest_path))
    check_run_id(manifest["run_id"], source=str(run.manifest_path))
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
    info = lock_facts(state.info, run.path / SUPERVISOR)
    if state.state == "live" and info.get("recovering"):
        raise UserError(state.describe(), source=str(run.path), fix="let that recovery finish")
    if state.state == "live":
        pid = info.get("pid")
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
    # lazy: bench.reproduce brings analysis.compare and numpy; `recover`'s checks need neither
    from draftscope.bench.reproduce import config_of

    # The frozen config is checked (and the plan made) before anything is stopped or written.
    plan = plan_benchmark(config_of(run.path, manifest), str(run.path))
    _check_leftovers(run.path, manifest, info, force=force)  # its refusals come before the lock is taken
    supervision = Supervision.adopt(run.path)  # refuses if a second recover got there first
    try:
        left = _stop_leftovers(run.path, manifest, info, force=force, say=say)
        cut = repair_tail(run.path / RECORDS)
        run.supervision = supervision
        return _close(run, plan, manifest, info, left, cut)
    finally:
        supervision.release()  # when finishing failed; a no-op after `end`


def lock_facts(info: Any, lock: Path) -> dict[str, Any]:
    """The lock's facts, each of the type the kit writes (`Supervision`): a pid or pgid is a plausible process
    number, a host a name, an engine one the kit drives. Anything else is refused, naming the field: a lock is
    read from the run directory, and its numbers choose which processes are signalled."""
    if not isinstance(info, Mapping):
        raise UserError("the supervisor lock is not a JSON object", source=str(lock), fix=LOCK_FIX)

    def bad(field: str, value: Any, what: str) -> UserError:
        return UserError(f"must be {what}", source=str(lock), field=field, value=value, fix=LOCK_FIX)

    def number(field: str, value: Any) -> None:
        if value is not None and (type(value) is not int or not 1 < value <= PID_MAX):
            raise bad(field, value, f"a process number (an integer from 2 to {PID_MAX})")

    for key in ("pid", "recovering"):
        number(key, info.get(key))
    for key in ("host", "since"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise bad(key, info[key], "a string")
    step = info.get("step")
    if step is not None:
        if not isinstance(step, Mapping):
            raise bad("step", step, "an object (name, pgid or engine and container)")
        number("step.pgid", step.get("pgid"))
        for key in ("name", "container"):
            if step.get(key) is not None and not isinstance(step[key], str):
                raise bad(f"step.{key}", step[key], "a string")
        if step.get("engine") is not None:
            engine_program(step["engine"], source=str(lock), field="step.engine", fix=LOCK_FIX)
    return dict(info)


def _engine_of(manifest: Mapping[str, Any], info: Mapping[str, Any]) -> str | None:
    runtime = manifest["config"].get("runtime")
    return (info.get("step") or {}).get("engine") or (runtime if runtime in ENGINES else None)


def _check_leftovers(run: Path, manifest: Mapping[str, Any], info: Mapping[str, Any], *, force: bool) -> None:
    """Refuse, before anything is taken or stopped, a step that may run on another host or a live process group
    that cannot be shown to be this run's."""
    step = info.get("step") or {}
    host, pgid = info.get("host"), step.get("pgid")
    if host != socket.gethostname() and (_engine_of(manifest, info) or pgid) and not force:
        where = f"ran on host {host}" if host else "records no host"
        raise UserError(
            f"the run's supervisor {where}, where its step may still run",
            source=str(run),
            fix=(f"run `invoke recover` on {host}; " if host else "") + FORCE_FIX,
        )
    local = pgid is not None and host == socket.gethostname()
    if local and not force and group_alive(pgid) and not _belongs_to(pgid, run):
        raise _not_this_runs(pgid, run)


def _not_this_runs(pgid: int, run: Path) -> UserError:
    return UserError(
        f"the step's process group {pgid} is alive, and it cannot be confirmed to be this run's",
        source=str(run),
        fix=f"stop it yourself (`kill -TERM -- -{pgid}`) if it is; {FORCE_FIX}",
    )


def _stop_leftovers(
    run: Path, manifest: Mapping[str, Any], info: Mapping[str, Any], *, force: bool, say: Printer
) -> list[str]:
    """Stop the step's work that outlived its supervisor; returns what was done, for the reason."""
    host = info.get("host")
    engine = _engine_of(manifest, info)
    pgid = (info.get("step") or {}).get("pgid")
    done: list[str] = []
    if engine:
        program = engine_program(
            engine, source=str(run / MANIFEST), field="$.config.runtime", fix="restore the run's manifest"
        )
        done += _remove_containers(engine, program, manifest["run_id"], force=force, say=say)
    if pgid is not None and host == socket.gethostname():
        done += _stop_group(pgid, run, force=force, say=say)
    elif pgid is not None:
        done.append(f"process group {pgid} not checked: the supervisor ran on {host or 'an unrecorded host'}")
    return done


def _remove_containers(
    engine: str, program: str | None, run_id: str, *, force: bool, say: Printer
) -> list[str]:
    listing = _engine(program, "ps", "--all", "--quiet", "--filter", f"label=draftscope.run={run_id}")
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
    ids = [i for i in listing.stdout.split() if CONTAINER_ID.fullmatch(i)]
    for ident in ids:
        say(f"removing container {ident[:12]} left by the run")
        _engine(program, "rm", "--force", ident)
    return [f"{len(ids)} leftover container(s) removed"] if ids else []


def _engine(program: str | None, *args: str) -> subprocess.CompletedProcess | None:
    """`program` (a kit-known engine found on PATH, `engine_program`) with `args`; None when it cannot run."""
    if program is None:
        return None
    try:
        return subprocess.run([program, *args], capture_output=True, text=True, timeout=120, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def _stop_group(pgid: int, run: Path, *, force: bool, say: Printer, grace: float = 10.0) -> list[str]:
    if not group_alive(pgid):
        return []
    if not _belongs_to(pgid, run):
        if force:
            return [f"process group {pgid} is alive but not recognisably this run's: left alone"]
        raise _not_this_runs(pgid, run)
    say(f"stopping the step's process group {pgid}, which outlived its supervisor")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return [f"the step's process group {pgid} was stopped"]


def _belongs_to(pgid: int, run: Path) -> bool:
    """The group's leader is this run's step: it leads its own group, is this user's, and its command line has
    `--run-dir` naming this run directory (resolved from the process's own working directory). A reused pid, or a
    number a planted lock chose, would not pass."""
    proc = Path(f"/proc/{pgid}")
    try:
        fields = (proc / "stat").read_text().rpartition(")")[2].split()
        words = (proc / "cmdline").read_bytes().split(b"\0")
        owner = proc.stat().st_uid
        cwd = os.readlink(proc / "cwd")
    except (OSError, IndexError):
        return False
    if len(fields) < 3 or fields[2] != str(pgid) or owner != os.getuid():
        return False
    want = os.path.realpath(run)
    for i, word in enumerate(words):
        text = word.decode(errors="replace")
        value = None
        if text == "--run-dir" and i + 1 < len(words):
            value = words[i + 1].decode(errors="replace")
        elif text.startswith("--run-dir="):
            value = text.partition("=")[2]
        if value and os.path.realpath(os.path.join(cwd, value)) == want:
            return True
    return False


def _close(
    run: RunDir,
    plan: Plan,
    manifest: Mapping[str, Any],
    info: Mapping[str, Any],
    left: list[str],
    cut: int,
) -> dict[str, Any]:
    steps = [dict(s) for s in manifest.get("steps", [])]
    name = (info.get("step") or {}).get("name")
    for entry in steps:
        if entry.get("status") == "running":
            entry.update(status="interrupted", exit_code=None, seconds=None)
            name = name or entry["name"]
    who = (
        f"pid {info['pid']} on {info.get('host') or 'an unrecorded host'}"
        if info.get("pid")
        else "the supervisor"
    )
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
