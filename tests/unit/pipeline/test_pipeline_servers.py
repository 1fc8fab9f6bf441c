"""Server lifecycle of the serving stages: health wait, a server that dies early or never gets healthy, stop with
SIGKILL after the grace period, clients side by side, and a server dying under its clients — real processes."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from draftscope.core.errors import UserError
from draftscope.pipeline import servers as S
from draftscope.pipeline.base import Command

# A loopback server whose /health answers HEALTH (an int), optionally ignoring SIGTERM.
SERVER = """
import signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
status, stubborn = int(sys.argv[2]), sys.argv[3] == "1"
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
print("listening", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server(name: str, status: int = 200, stubborn: bool = False) -> Command:
    port = free_port()
    return Command(
        name, (sys.executable, "-c", SERVER, str(port), str(status), "1" if stubborn else "0"), port=port
    )


def quiet(_line: str) -> None:
    pass


def test_servers_start_get_healthy_and_are_stopped(tmp_path):
    commands = [server("server-0"), server("server-1")]
    with S.serving(commands, logs=tmp_path, stage="t", startup_timeout=30, say=quiet) as group:
        assert all(S.healthy(url) for url in group.urls)
        processes = [r.process for r in group.running]
    assert all(p.poll() is not None for p in processes)
    assert not any(S.healthy(S.url_of(c)) for c in commands)
    assert "listening" in (tmp_path / "t.server-0.log").read_text()


def test_a_server_that_exits_early_fails_with_its_log(tmp_path):
    dying = Command(
        "server-0", (sys.executable, "-c", "import sys; print('no GPU here'); sys.exit(3)"), port=1
    )
    group = S.ServerGroup([dying], logs=tmp_path, stage="t", startup_timeout=30, say=quiet)
    with pytest.raises(UserError, match=r"t.instances\[0\]: server-0 exited with code 3.*no GPU here"), group:
        pass


def test_a_port_another_process_answers_on_is_refused_before_anything_starts(tmp_path):
    """Another server on the port would pass the health wait and serve the rows from its own model."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        taken = Command("server-1", (sys.executable, "-c", SERVER, str(port), "200", "0"), port=port)
        group = S.ServerGroup(
            [server("server-0"), taken], logs=tmp_path, stage="regen", startup_timeout=30, say=quiet
        )
        with pytest.raises(UserError) as refused, group:
            pass
    text = str(refused.value)
    assert (
        "regen.instances[1].port" in text and f"port {port} is in use" in text and "regen.base_port" in text
    )
    assert group.running == [] and not list(tmp_path.glob("regen.*.log"))  # no server was started


def test_a_server_never_healthy_times_out_and_is_stopped(tmp_path):
    sick = server("server-0", status=503)
    started = time.monotonic()
    group = S.ServerGroup([sick], logs=tmp_path, stage="t", startup_timeout=1.5, say=quiet)
    with pytest.raises(UserError, match=r"t.startup_timeout_s: server-0 not healthy after 2 s"), group:
        pass
    assert time.monotonic() - started < 30
    assert group.running == []


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path):
    group = S.ServerGroup(
        [server("server-0", stubborn=True)], logs=tmp_path, stage="t", startup_timeout=30, say=quiet
    )
    group.start()
    group.wait_healthy()
    process = group.running[0].process
    group.stop(grace=0.5)
    assert process.returncode is not None and process.returncode < 0  # killed by a signal


def test_clients_run_side_by_side_and_report_exit_codes(tmp_path):
    clients = [
        Command("client-0", (sys.executable, "-c", "print('a')")),
        Command("client-1", (sys.executable, "-c", "import sys; sys.exit(4)")),
    ]
    assert S.run_clients(clients, logs=tmp_path, stage="t", poll=0.05) == {"client-0": 0, "client-1": 4}
    assert (tmp_path / "t.client-0.log").read_text() == "a\n"


def test_a_server_dying_under_its_clients_fails_the_stage(tmp_path):
    long_client = Command("client-0", (sys.executable, "-c", "import time; time.sleep(60)"))
    with S.serving([server("server-0")], logs=tmp_path, stage="t", startup_timeout=30, say=quiet) as group:
        group.running[0].process.kill()
        started = time.monotonic()
        with pytest.raises(UserError, match="server-0 exited with code -9 while serving"):
            S.run_clients([long_client], logs=tmp_path, stage="t", group=group, poll=0.05)
        assert time.monotonic() - started < 30


def test_commands_round_trip_through_the_file(tmp_path):
    from draftscope.core.jsonio import atomic_write_json

    command = Command(
        "server-0", ("vllm", "serve", "m"), env={"CUDA_VISIBLE_DEVICES": "2,3"}, gpus=(2, 3), port=8100
    )
    atomic_write_json(
        tmp_path / "c.json", {"schema_version": 1, "stage": "regen", "commands": [command.to_dict()]}
    )
    assert S.load_commands(tmp_path / "c.json") == [command]
    (tmp_path / "bad.json").write_text('{"commands": [{"argv": []}]}')
    with pytest.raises(UserError, match="not a commands file"):
        S.load_commands(tmp_path / "bad.json")
