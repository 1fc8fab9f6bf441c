"""In-container server management for the stages that serve a model (regen, hsextract, serve, bench).

A stage's commands file (`stages/<stage>.commands.json`, written by the host from the same `Command`s the dry run
prints) lists the processes to start: servers (a `port`) and, for hsextract, clients. `ServerGroup` starts every
server with its own environment (its `CUDA_VISIBLE_DEVICES`), its output in `logs/<stage>.<name>.log`, waits until
each answers its health endpoint, and stops them all on the way out — SIGTERM, then SIGKILL after a grace period —
whatever ends the block (an error, Ctrl-C, the runtime's SIGTERM). A server that exits before it is healthy fails
the stage at once with the tail of its log.

Servers stay in the stage's process group (no new session): when the runtime kills the group on a time limit, the
servers go with the client. HTTP is plain `urllib` on loopback: no client library to pin.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.pipeline.base import Command

HOST = "127.0.0.1"
GRACE_SECONDS = 30.0
# Answers worth another try (timeout, conflict, too early, rate limit); every 5xx and no answer at all too.
RETRY_STATUSES = frozenset({408, 409, 425, 429})


def load_commands(path: str | Path) -> list[Command]:
    """The commands file the host wrote for this stage."""
    data = read_json(Path(path), expect=dict)
    try:
        return [
            Command(
                name=c["name"],
                argv=tuple(c["argv"]),
                env=dict(c.get("env") or {}),
                gpus=tuple(c.get("gpus") or ()),
                port=c.get("port"),
            )
            for c in data["commands"]
        ]
    except (KeyError, TypeError) as exc:
        raise UserError(f"not a commands file ({exc})", source=str(path)) from None


def servers_of(commands: Sequence[Command]) -> list[Command]:
    return [c for c in commands if c.port is not None]


def clients_of(commands: Sequence[Command]) -> list[Command]:
    return [c for c in commands if c.port is None]


def url_of(command: Command) -> str:
    return f"http://{HOST}:{command.port}"


def port_answers(port: int | None, timeout: float = 0.5) -> bool:
    """Whether something accepts connections on this host's `port` (None: a command without one)."""
    if port is None:
        return False
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def process_argv(argv: Sequence[str]) -> list[str]:
    """`python` in a command means this interpreter (the image's, or the local runtime's environment)."""
    out = list(argv)
    if out and out[0] in ("python", "python3"):
        out[0] = sys.executable
    return out


def process_env(command: Command) -> dict[str, str]:
    """A server inherits the stage's environment, with its own variables (its GPUs) and unbuffered output."""
    return settings.child_env({**command.env, settings.PYTHONUNBUFFERED.name: "1"})


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --- HTTP ---------------------------------------------------------------------------------------------------------


class HttpError(Exception):
    """A request that got no usable answer: an HTTP status (`status`), or no response at all (`status` None)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def request(method: str, url: str, body: Any = None, *, timeout: float = 30.0) -> tuple[int, bytes]:
    """One HTTP request; returns (status, body) for any status; raises HttpError when nothing came back."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() or b""
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HttpError(f"{method} {url}: {reason}") from None


def retryable(status: int | None) -> bool:
    """Whether a request that got `status` (None: no answer) may succeed when sent again."""
    return status is None or status in RETRY_STATUSES or status >= 500


def get_json(url: str, *, timeout: float = 30.0) -> Any:
    status, body = request("GET", url, timeout=timeout)
    if status != 200:
        raise HttpError(f"GET {url}: HTTP {status}", status, body.decode("utf-8", "replace")[:500])
    return json.loads(body)


def get_text(url: str, *, timeout: float = 30.0) -> str:
    status, body = request("GET", url, timeout=timeout)
    if status != 200:
        raise HttpError(f"GET {url}: HTTP {status}", status, body.decode("utf-8", "replace")[:500])
    return body.decode("utf-8", "replace")


def healthy(url: str, path: str = "/health", timeout: float = 5.0) -> bool:
    try:
        status, _ = request("GET", url + path, timeout=timeout)
    except HttpError:
        return False
    return status == 200


# --- the group of servers -------------------------------------------------------------------------------------


@dataclass
class Running:
    command: Command
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return url_of(self.command)


class ServerGroup:
    """Start servers, wait for health, always stop them. Use as a context manager."""

    def __init__(
        self,
        commands: Sequence[Command],
        *,
        logs: Path,
        stage: str,
        startup_timeout: float,
        health_path: str = "/health",
        say=print,
    ) -> None:
        self.commands = servers_of(commands)
        self.logs = logs
        self.stage = stage
        self.startup_timeout = startup_timeout
        self.health_path = health_path
        self.say = say
        self.running: list[Running] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> ServerGroup:
        self._previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM,)}
        try:
            self.start()
            self.wait_healthy()
        except BaseException:
            self.stop()
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.running]

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for index, command in enumerate(self.commands):
            # A server that cannot bind exits, but another process answering on its port would pass the health
            # wait and serve the stage's rows from whatever model it holds: refused before any server starts.
            if port_answers(command.port):
                raise UserError(
                    f"port {command.port} is in use: another process answers there, and {command.name}'s rows "
                    "would come from it",
                    field=f"{self.stage}.instances[{index}].port",
                    value=command.port,
                    fix=f"stop that process, or set {self.stage}.base_port (or the instance's port) to a free port",
                )
        for command in self.commands:
            log = self.logs / f"{self.stage}.{command.name}.log"
            with log.open("ab") as out:
                process = subprocess.Popen(
                    process_argv(command.argv),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=process_env(command),
                )
            self.running.append(Running(command, process, log))
            gpus = f" on GPUs {list(command.gpus)}" if command.gpus else ""
            self.say(f"{self.stage}: started {command.name}{gpus} at {url_of(command)} (log {log.name})")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = list(self.running)
        delay = 0.2
        while pending:
            for run in list(pending):
                code = run.process.poll()
                if code is not None:
                    raise UserError(
                        f"{run.command.name} exited with code {code} before it was healthy; "
                        f"last lines of {run.log}:\n{log_tail(run.log)}",
                        field=f"{self.stage}.instances[{self.running.index(run)}]",
                    )
                if healthy(run.url, self.health_path):
                    pending.remove(run)
                    self.say(f"{self.stage}: {run.command.name} healthy")
            if not pending:
                return
            if time.monotonic() > deadline:
                names = ", ".join(r.command.name for r in pending)
                raise UserError(
                    f"{names} not healthy after {self.startup_timeout:.0f} s",
                    field=f"{self.stage}.startup_timeout_s",
                    fix="raise the startup timeout, or read the server logs in logs/",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def check_alive(self) -> None:
        """Raise if a server died while clients were using it."""
        for run in self.running:
            code = run.process.poll()
            if code is not None:
                raise UserError(
                    f"{run.command.name} exited with code {code} while serving; last lines of {run.log}:\n"
                    f"{log_tail(run.log)}"
                )

    def stop(self, grace: float = GRACE_SECONDS) -> None:
        for run in self.running:
            if run.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    run.process.terminate()
        deadline = time.monotonic() + grace
        for run in self.running:
            try:
                run.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    run.process.kill()
                run.process.wait()
        self.running = []


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# `with serving(commands, ...) as group:` the servers are up and healthy inside, and stopped after: the group is its
# own context manager.
serving = ServerGroup


def run_clients(
    commands: Sequence[Command],
    *,
    logs: Path,
    stage: str,
    group: ServerGroup | None = None,
    poll: float = 1.0,
) -> dict[str, int]:
    """Run client commands side by side to completion (their output in logs/); exit codes by name. A server
    that dies meanwhile stops the clients and fails the stage."""
    procs: list[tuple[Command, subprocess.Popen]] = []
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for command in clients_of(commands):
            with (logs / f"{stage}.{command.name}.log").open("ab") as out:
                procs.append(
                    (
                        command,
                        subprocess.Popen(
                            process_argv(command.argv),
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            env=process_env(command),
                        ),
                    )
                )
        while any(p.poll() is None for _, p in procs):
            if group is not None:
                group.check_alive()
            time.sleep(poll)
        return {c.name: p.returncode for c, p in procs}
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
