"""What every runtime shares: the execution context, the outcome, and the supervised wait with a hard limit."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from draftscope.core import settings
from draftscope.core.platforms import host_user
from draftscope.runtime.step import Step

# Variables a step may receive from the host environment, by name, besides the step's own (each declared, with its
# doc, in core.settings). No credential: those go to the steps that fetch only (`Step.credentials`), also by name
# (their values never enter an argv, a log line the kit writes, or a manifest).
ENV_ALLOW = (
    settings.CUDA_VISIBLE_DEVICES.name,
    settings.NVIDIA_VISIBLE_DEVICES.name,
    settings.TZ.name,
    settings.DRAFTSCOPE_FAILPOINT.name,  # fault injection (tests); recorded in the manifest when set
    settings.OMP_NUM_THREADS.name,  # CPU runs side by side: keep them from oversubscribing the cores
)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has Linux send the child SIGTERM when this process dies, however it dies (SIGKILL, the
    OOM killer): a local step then stops instead of running on unsupervised, and a container engine's client
    passes the signal to its container. None where the kernel has no such request (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    set_pdeathsig = 1  # PR_SET_PDEATHSIG

    def arm() -> None:
        prctl(set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _host_user() -> tuple[int, int]:
    return host_user()


@dataclass(frozen=True)
class Context:
    """Where and as whom a step runs."""

    run_dir: Path
    run_id: str
    user: tuple[int, int] = field(default_factory=_host_user)  # Windows has no POSIX ids: the images' user
    grace_seconds: float = 5.0  # SIGTERM → SIGKILL on expiry
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # Told where each step's work can be found once it has started (`pgid`, or `engine` and `container`): the
    # benchmark supervisor keeps it in its lock file for `invoke recover`.
    on_start: Callable[..., None] | None = field(default=None, compare=False)

    def started(self, step: str, **where: object) -> None:
        if self.on_start is not None:
            self.on_start(step, **where)


@dataclass(frozen=True)
class Outcome:
    """How a step ended. `status` uses the run-manifest vocabulary."""

    step: str
    status: str  # completed | failed | timed_out | interrupted
    exit_code: int | None
    seconds: float
    reason: str | None
    log: Path | None
    container: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class Runtime(Protocol):
    """What callers may ask a runtime; they never test its class. `uses_images` says whether steps run in their
    images (docker, podman) or in this Python environment (local)."""

    name: str
    uses_images: bool

    def argv(self, step: Step, ctx: Context) -> list[str]: ...

    def run(self, step: Step, ctx: Context) -> Outcome: ...

    def image_facts(self, image: str) -> dict[str, Any]:
        """Reference, id and repo digests of the image a step runs in (all None when it runs locally)."""
        ...

    def check_images(self, images: Iterable[str]) -> None:
        """A UserError naming the first image that is not there and how to build it; nothing to check locally."""
        ...

    def image_reference(self, image: str) -> str | None:
        """The reference a step's image runs under, or None when steps do not run in images."""
        ...

    def with_host_network(self) -> Runtime:
        """The same runtime with its containers on the node's network (torchrun across nodes)."""
        ...

    def with_recorded_image(self, facts: Mapping[str, Any]) -> Runtime:
        """The same argv, with image facts already read elsewhere (a merge job on a node without the engine)."""
        ...


NO_IMAGE: dict[str, Any] = {"reference": None, "id": None, "repo_digests": []}


def container_name(ctx: Context, step: str) -> str:
    """ds-<run>-<step>-<hash of the run directory>: traceable to the run, unique per run directory, and
    deterministic, so a dry run prints exactly the name the real run uses."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{ctx.run_id}-{step}").strip("-.")[:80]
    digest = hashlib.sha256(str(ctx.run_dir.absolute()).encode()).hexdigest()[:8]
    return f"ds-{clean}-{digest}"


def log_path(ctx: Context, step: Step) -> Path:
    logs = ctx.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{step.name}.log"


def tail(path: Path | None, lines: int = 5, limit: int = 600) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:]
    return " | ".join(text)[-limit:]


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a batch scheduler, a container stop) asks the supervisor to stop, as Ctrl-C does."""


class StopSignals:
    """SIGINT and SIGTERM for a supervisor that must record how its run ended, whatever number of them arrive.

    The first raises KeyboardInterrupt (`Terminated` for SIGTERM) in the main thread, as Ctrl-C does, so that the
    running step is stopped. From then on the supervisor is shielded: every further signal is only counted, so that
    the finalisation (stop the step, write the summary and the final status, let go of the lock) runs to its end.
    `shield()` does the same before a first signal (the normal finish: a Ctrl-C there no longer aborts it).
    A watchdog bounds the finalisation: if it has not ended `bound` seconds after the first signal, `on_expiry`
    (the supervisor's: record the true reason where `invoke recover` finds it) runs and the process exits with
    128 + the signal's number."""

    def __init__(self, bound: float = 300.0) -> None:
        self.first: int | None = None  # the signal that stopped the command
        self.later = 0  # signals that arrived after it (counted, not acted on)
        self.shielded = False
        self.bound = bound
        self.on_expiry: Callable[[int], None] | None = None
        self._watchdog: threading.Timer | None = None

    @property
    def code(self) -> int | None:
        """The conventional exit code: 130 after SIGINT, 143 after SIGTERM; None when no signal arrived."""
        return None if self.first is None else 128 + self.first

    def shield(self) -> None:
        self.shielded = True

    def handle(self, signum: int, frame: object) -> None:
        if self.first is None:
            self.first = signum
            self._arm()
        else:
            self.later += 1
        if self.shielded:
            return
        self.shielded = True
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def _arm(self) -> None:
        self._watchdog = threading.Timer(self.bound, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _expire(self) -> None:
        signum = self.first or signal.SIGINT
        try:
            if self.on_expiry is not None:
                self.on_expiry(signum)
        finally:
            os._exit(128 + signum)

    def done(self) -> None:
        """The finalisation ended: the watchdog stands down."""
        if self._watchdog is not None:
            self._watchdog.cancel()


_ACTIVE: StopSignals | None = None


@contextlib.contextmanager
def stop_signals(bound: float = 300.0) -> Iterator[StopSignals]:
    """SIGINT and SIGTERM handled by a `StopSignals` while inside (re-entrant: an inner call shares the outer one).
    When a signal was taken, both are ignored from the way out on: the process is stopping with everything
    recorded, and one more Ctrl-C must not turn its last line into a traceback or its exit code into 1 (an ignored
    signal stays ignored while the interpreter shuts down; a Python handler would be reset to the default there)."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    signals = StopSignals(bound)
    if threading.current_thread() is not threading.main_thread():
        yield signals  # signals reach the main thread only: nothing to install
        return
    previous = {s: signal.signal(s, signals.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    _ACTIVE = signals
    try:
        yield signals
    finally:
        _ACTIVE = None
        signals.done()
        for s, handler in previous.items():
            signal.signal(s, handler if signals.first is None else signal.SIG_IGN)
        signals.on_expiry = None


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` in the main thread, so the supervisor stops its step and records
    the run as interrupted; Python's default would end the supervisor at once and leave the step running. Inside
    `stop_signals` it changes nothing: SIGTERM is already handled there, with the shield."""
    if threading.current_thread() is not threading.main_thread() or _ACTIVE is not None:
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_reason(exc: KeyboardInterrupt) -> str:
    if isinstance(exc, Terminated):
        return "terminated (SIGTERM); the step was stopped"
    return "interrupted by the user (Ctrl-C); the step was stopped"


def supervise(
    proc: subprocess.Popen,
    *,
    max_seconds: float | None,
    stop: Callable[[], None],
    started: float,
    finished: Callable[[], bool] | None = None,
    linger: float = 15.0,
) -> tuple[str, str | None]:
    """Wait for `proc` within `max_seconds` of `started`; on expiry, Ctrl-C or SIGTERM call `stop` (which must
    end the work itself, not only this client process) and wait for the client. Returns (status, reason).

    `finished` asks whether the work itself has ended (a container has exited, asked of its engine): a client that
    outlives its work by `linger` seconds is stopped and the work counts as exited (podman's Docker API can leave an
    attached `docker run` waiting after its container has exited; the caller reads the exit code from the engine)."""
    try:
        deadline = None if max_seconds is None else started + max_seconds
        with sigterm_interrupts():
            _wait(proc, deadline, finished, linger)
        return "exited", None
    except subprocess.TimeoutExpired:
        stop()
        _reap(proc)
        return (
            "timed_out",
            f"time limit of {max_seconds:g} s reached (loading and warm-ups included); the step was killed",
        )
    except KeyboardInterrupt as exc:
        stop()
        _reap(proc)
        return "interrupted", interrupted_reason(exc)


POLL_S = 5.0


def _wait(
    proc: subprocess.Popen, deadline: float | None, finished: Callable[[], bool] | None, linger: float
) -> None:
    """proc.wait until `deadline` (TimeoutExpired then), ending early a client whose work `finished` long ago."""
    ended_at = None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if finished is not None:
            timeout = POLL_S if timeout is None else min(timeout, POLL_S)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
        if ended_at is None:
            ended_at = time.monotonic() if finished is not None and finished() else None
        elif time.monotonic() - ended_at >= linger:
            proc.terminate()
            _reap(proc, 10.0)
            return


def _reap(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait for the stopped client; kill it after `timeout`, and give up after as long again (a process stuck in
    the kernel ignores even SIGKILL): the caller then finds the step still there and says so."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)


def outcome_from_exit(
    step: Step,
    code: int | None,
    seconds: float,
    log: Path | None,
    container: str | None,
    what: str | None = None,
    *,
    oom_killed: bool = False,
) -> Outcome:
    """How a step that exited ended; `oom_killed`: the engine says the kernel's OOM killer ended its container."""
    if code == 0:
        return Outcome(step.name, "completed", 0, seconds, None, log, container)
    if container is not None and what is None and (oom_killed or code == OOM_EXIT):
        return Outcome(
            step.name, "failed", code, seconds, out_of_memory(step, code, oom_killed), log, container
        )
    detail = settings.masked(tail(log), step.by_name)  # the log's words, the values given by name masked
    who = f"{what} for step '{step.name}'" if what else f"step '{step.name}'"
    killed = f" (killed by {_signal_name(code)})" if code is not None and code < 0 else ""
    reason = f"{who} exited with code {code}{killed}" + (f": {detail}" if detail else "")
    return Outcome(step.name, "failed", code, seconds, reason, log, container)


# A container's process killed by SIGKILL exits 128 + 9: the kernel's OOM killer at the container's memory limit
# sends it (the engine's `State.OOMKilled` says so when it saw it); nothing else of the kit's does without saying.
OOM_EXIT = 137


def out_of_memory(step: Step, code: int | None, oom_killed: bool) -> str:
    """The reason of a container ended for memory: the limit that was hit and the setting that raises it."""
    how = (
        "the kernel's OOM killer ended it"
        if oom_killed
        else "it was killed by SIGKILL, as the OOM killer does"
    )
    return (
        f"out of memory: step '{step.name}' hit its container's memory limit of {step.limits.memory} "
        f"(no swap; {how}, exit code {code}); fix: raise the limit with --opts container.memory=SIZE "
        "(the experiment's or pipeline config's container.memory, e.g. 32g), or make the step smaller"
    )


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"
