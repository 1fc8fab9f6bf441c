"""The fetch step reaches the hub through a mirror or a proxy the user names, and records only the names (issue 33).

A real benchmark of a hub preset (`--runtime local`, the Transformers backend) starts with its fetch step, which
runs `python -m draftscope fetch` with huggingface_hub. Here `HF_ENDPOINT` names a mirror that is a server on
loopback made by the test: it answers every request 404 and logs it. So the fetch step fails (nothing is
downloaded, the benchmark never starts), and what it asked shows that the variable reached it. `HTTPS_PROXY`
carries a planted password and `NO_PROXY` lets the loopback mirror bypass it: the manifest names the three
variables the fetch step was given and holds none of their values, and no file of the run holds the password.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from support import run_invoke

pytestmark = pytest.mark.integration

pytest.importorskip("huggingface_hub")

REPO, REVISION = "Qwen/Qwen3-8B", "b968826d9c46dd6066d109eabc6255188de91218"  # the qwen3-8b preset's pin
SECRET = "proxy-password-planted"


class Mirror(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        Mirror.seen.append(f"{self.command} {self.path}")
        body = b'{"error": "not here"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:  # quiet
        return


@pytest.fixture
def mirror():
    Mirror.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_fetch_step_uses_the_mirror_and_the_manifest_holds_only_names(tmp_path, mirror):
    run = tmp_path / "run"
    env = {
        "HF_ENDPOINT": mirror,
        "HTTPS_PROXY": f"http://user:{SECRET}@127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    argv = ["benchmark", "--backend", "transformers", "--preset", "qwen3-8b", "--device", "cpu"]
    argv += ["--runtime", "local", "--prompts", "examples/prompts.json", "--output", str(run)]
    proc = run_invoke(*argv, env=env, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    # The mirror was asked for the pinned revision of the preset's repository: HF_ENDPOINT reached the fetch step.
    assert any(REPO in line and REVISION in line for line in Mirror.seen), Mirror.seen
    manifest = json.loads((run / "manifest.json").read_text())
    (fetch,) = [s for s in manifest["steps"] if s["name"] == "fetch"]
    assert fetch["status"] == "failed"
    assert fetch["by_name"] == ["HF_ENDPOINT", "HTTPS_PROXY", "NO_PROXY"]
    assert not any(s["name"] == "benchmark" for s in manifest["steps"])  # the worker never ran
    # the name, never the value: the reason quotes the step's log with the values given by name masked
    assert mirror not in (run / "manifest.json").read_text()
    assert "$HF_ENDPOINT/api/models/" + REPO in manifest["reason"], manifest["reason"]
    for path in run.rglob("*"):  # the password in no file of the run (the step's log included)
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
