"""Helpers shared by the test tiers (import as `from support import …`; never import from a conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "vllm", "sglang", "speculators", "triton")


def unavailable(message: str) -> NoReturn:
    """A tier's prerequisite is missing here (an engine, root, Slurm, a browser): skip the test, but fail it under
    CI (`$CI` set), where a missing prerequisite is a missing set-up step, never a pass."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def run_tasks(namespace, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`invoke ARGS` over `namespace` (an invoke Collection) under the kit's parser, in this process (no interpreter
    start-up): the exit code, stdout and stderr as a CompletedProcess."""
    import contextlib
    import io

    from invoke import Program

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            Program(namespace=namespace, name="draftscope", binary="invoke").run(["invoke", *args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def wall_bound(seconds: float) -> float:
    """A wall-time bound for a command that should be quick, scaled by the pytest workers sharing this machine's
    cores (`make test` runs two with pytest-xdist): a guard against a slow path (an import of torch, a sleep), never
    a performance figure."""
    return seconds * max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def run_invoke(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60):
    """Run `invoke ARGS` as a user would, in a fresh interpreter."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tiny_files_missing() -> list[str]:
    """What keeps the kit-built tiny models from loading here (`invoke tiny.build --check`): [] when they are in place."""
    from draftscope.core.errors import UserError

    try:
        from draftscope import tiny

        return tiny.check_files()
    except UserError as exc:
        return [exc.render()]


def needs_tiny_files():
    """A skip mark for the modules that run the tiny models, naming what is missing."""
    import pytest

    missing = tiny_files_missing()
    return pytest.mark.skipif(
        bool(missing), reason=f"tiny model files not in place: {'; '.join(missing)[:200]}"
    )


def tiny_benchmark(runtime: str = "local", *extra: str, device: str = "cpu") -> list[str]:
    """`invoke benchmark` arguments for the kit-built tiny models, on the CPU unless `device` (add --output)."""
    return [
        "benchmark",
        "--backend",
        "transformers",
        "--preset",
        "tiny",
        "--device",
        device,
        "--runtime",
        runtime,
        "--prompts",
        "examples/prompts.json",
        *extra,
    ]


# `invoke pipeline …` through the pipeline's own tasks, in a fresh interpreter (the environment decides which kit).
INVOKE_PIPELINE = (
    "from invoke import Collection, Program; from draftscope.cli.pipeline import PIPELINE_TASKS; "
    "Program(namespace=Collection(*PIPELINE_TASKS), binary='invoke').run()"
)


def tiny_regen_argv(workdir: Path, *opts: str) -> list[str]:
    """`invoke pipeline --stage regen` of the tiny preset with the local runtime, each of `opts` as `--opts`."""
    argv = [sys.executable, "-c", INVOKE_PIPELINE, "pipeline", "--preset", "tiny", "--runtime", "local"]
    argv += ["--stage", "regen", "--workdir", str(workdir)]
    for opt in opts:
        argv += ["--opts", opt]
    return argv


def regen_output_ids(workdir: Path) -> list[str]:
    """The ids of regen's complete output lines, in file order (a torn last line does not count)."""
    path = workdir / "regen" / "rows.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.endswith("}")]


def child_pids(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens there (connections in TIME_WAIT do not count, as for a server binding it)."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# A small random Qwen3-shaped target for the CPU training tests (built by the tests with the kit's tokenizer).
SMALL_QWEN3_PRESET = """\
schema_version: 1
name: small
display_name: small random Qwen3 (test)
source: hub
hub: {repo: test/small, revision: 0123456789abcdef0123456789abcdef01234567}
architecture: {kind: dense, model_type: qwen3, num_layers: 4, hidden_size: 64, vocab_size: 512,
               max_position_embeddings: 512}
dflash: {block_size: 4, decay_gamma: 2, target_layer_ids: [1, 2], num_draft_layers: 2, mask_token_id: 3}
training: {seq_length: 128, max_anchors: 16, nproc_per_node: 1, epochs: 1}
serving: {tp_size: 1}
status: {tested: false}
"""


def sbatch_lines(script: str) -> dict[str, str]:
    """A job script's `#SBATCH --option[=value]` lines, by option."""
    import re

    found = {}
    for line in script.splitlines():
        m = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(.*))?", line)
        if m:
            found[m.group(1)] = m.group(2) or ""
    return found


def processes_naming(*needles: str) -> list[str]:
    """Live (not zombie) processes other than this one whose command line holds any of the needles."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(n in cmdline for n in needles):
            found.append(f"{entry.name}: {cmdline}")  # whole: callers match paths in it
    return found


# A loopback server that answers GET /health with 200 (a stand-in for an inference server's health endpoint).
HEALTH_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
