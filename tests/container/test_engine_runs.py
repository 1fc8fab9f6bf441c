"""The runtime on a real engine: ownership, kill-on-timeout, exit codes, recorded image IDs and versions."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from containerlib import ROOT, docker
from support import tiny_benchmark

pytestmark = pytest.mark.container

TINY = tiny_benchmark("docker", "--repeats", "1", "--max-new-tokens", "24")


def invoke(*args: str, user: int | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "invoke", *args]
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "HOME": "/tmp"},
    )


def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def leftovers(run) -> str:
    return docker("ps", "--all", "--quiet", "--filter", f"label=draftscope.run={run.name}").stdout.strip()


@pytest.fixture
def shared_socket(engine):
    """Let an unprivileged invoking user reach the test engine's socket (test engine only)."""
    sock = os.environ["DOCKER_HOST"].removeprefix("unix://")
    mode = os.stat(sock).st_mode
    os.chmod(sock, 0o666)
    yield
    os.chmod(sock, mode & 0o777)


def test_tiny_benchmark_in_the_image_as_the_invoking_user(kit_image, shared_socket):
    import shutil
    import tempfile
    from pathlib import Path

    uid = 4321
    home = Path(tempfile.mkdtemp(prefix="draftscope-owner-", dir="/tmp"))  # traversable by the other user
    home.chmod(0o755)
    os.chown(home, uid, uid)
    run = home / "R1"
    result = invoke(*TINY, "--output", str(run), user=uid)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    m = manifest(run)
    assert m["status"] == "completed"
    # Every file the worker wrote through the bind mount belongs to the invoking user.
    for path in [run, *run.rglob("*")]:
        assert path.stat().st_uid == uid, path
    # The image reference, its ID and the versions reported from inside the container are recorded.
    image_id = json.loads(docker("image", "inspect", kit_image).stdout)[0]["Id"]
    assert {i["step"]: i["id"] for i in m["images"]} == {"benchmark": image_id}
    assert m["software"]["worker"]["torch"].startswith("2.13.0")
    assert m["software"]["worker"]["draftscope"] == m["kit"]["version"]
    assert invoke("validate", str(run)).returncode == 0
    assert leftovers(run) == ""
    shutil.rmtree(home)


def test_dry_run_prints_exactly_the_executed_argv(kit_image, tmp_path):
    run = tmp_path / "R2"
    dry = invoke(*TINY, "--output", str(run), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert not run.exists()
    printed = [line for line in dry.stdout.splitlines() if line and not line.startswith("#")]
    real = invoke(*TINY, "--output", str(run))
    assert real.returncode == 0, real.stdout[-3000:] + real.stderr[-3000:]
    executed = [shlex.join(step["argv"]) for step in manifest(run)["steps"]]
    assert printed == executed


def test_time_limit_kills_the_container_and_keeps_partial_records(kit_image, tmp_path):
    run = tmp_path / "R3"
    start = time.monotonic()
    result = invoke(
        *TINY, "--output", str(run), "--fixed-tokens", "100000", "--max-seconds", "8", "--opts", "warmups=0"
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr
    m = manifest(run)
    assert m["status"] == "timed_out" and "time limit of 8 s" in m["reason"]
    assert elapsed < 8 + 30, elapsed
    assert leftovers(run) == "", "the container must be gone after a timeout"
    for line in (run / "records.jsonl").read_text().splitlines():
        json.loads(line)
    assert invoke("validate", str(run)).returncode == 0


def test_a_failing_worker_reports_its_exit_code_and_reason(kit_image, tmp_path, monkeypatch):
    # Fault injection inside the container: the worker exits with code 7 after its second record.
    monkeypatch.setenv("DRAFTSCOPE_FAILPOINT", "after-records:2:exit:7")
    run = tmp_path / "R4"
    result = invoke(*TINY, "--output", str(run))
    assert result.returncode == 1, result.stderr
    m = manifest(run)
    assert m["status"] == "failed"
    (step,) = [s for s in m["steps"] if s["name"] == "benchmark"]
    assert step["exit_code"] == 7
    assert "step 'benchmark' exited with code 7" in m["reason"] and "failpoint" in m["reason"]
    assert any("fault injection was active" in note for note in m["notes"])
    assert len((run / "records.jsonl").read_text().splitlines()) == 2
    assert invoke("validate", str(run)).returncode == 0
    assert leftovers(run) == ""


def test_a_container_over_its_memory_limit_is_reported_out_of_memory(kit_image, tmp_path):
    # 96m, no swap: the worker's torch and the tiny models do not fit, and the kernel's OOM killer ends it. The run
    # says so, naming the limit hit and the setting that raises it, in the manifest and on the terminal.
    run = tmp_path / "R-oom"
    result = invoke(*TINY, "--opts", "container.memory=96m", "--output", str(run))
    assert result.returncode == 1, result.stderr
    m = manifest(run)
    assert m["status"] == "failed"
    (step,) = [s for s in m["steps"] if s["name"] == "benchmark"]
    assert step["exit_code"] == 137, m
    assert m["reason"].startswith(
        "out of memory: step 'benchmark' hit its container's memory limit of 96m"
    ), m
    assert "--opts container.memory=SIZE" in m["reason"]
    assert "out of memory" in result.stdout and "96m" in result.stdout, result.stdout[-2000:]
    assert invoke("validate", str(run)).returncode == 0
    assert leftovers(run) == ""


def test_an_engine_refusal_is_a_failure_not_a_success(kit_image, tmp_path):
    # GPU flags on this CPU-only, unprivileged engine: the container never starts. Its exit code would read 0;
    # the run must say failed, with the engine's message.
    run = tmp_path / "R5"
    result = invoke(*TINY, "--output", str(run), "--opts", "device=cuda")
    assert result.returncode == 1
    m = manifest(run)
    assert m["status"] == "failed" and m["reason"], m
    assert leftovers(run) == ""


def test_a_supervisor_killed_outright_leaves_nothing_running_and_recover_finishes_it(kit_image, tmp_path):
    """SIGKILL to the supervisor alone (the OOM killer's choice): the engine's client gets SIGTERM from the kernel
    (PR_SET_PDEATHSIG) and passes it on, so the container stops; `invoke recover` removes it and finishes the run."""
    run = tmp_path / "R6"
    argv = [sys.executable, "-m", "invoke", *TINY, "--output", str(run), "--fixed-tokens", "100000"]
    env = {**os.environ, "HOME": "/tmp"}
    supervisor = subprocess.Popen(
        [*argv, "--max-seconds", "300", "--opts", "warmups=0"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while (
            "running"
            not in docker(
                "ps", "--filter", f"label=draftscope.run={run.name}", "--format", "{{.State}}"
            ).stdout
        ):
            assert supervisor.poll() is None and time.monotonic() < deadline, "the container never started"
            time.sleep(0.5)
        time.sleep(3)  # the worker is loading or generating
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 60
        while docker("ps", "--quiet", "--filter", f"label=draftscope.run={run.name}").stdout.strip():
            assert time.monotonic() < deadline, "the container kept running after its supervisor was killed"
            time.sleep(0.5)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert manifest(run)["status"] == "running"
    checked = invoke("validate", str(run))
    assert "is gone without recording an end" in checked.stdout, checked.stdout
    recovered = invoke("recover", str(run))
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    m = manifest(run)
    assert m["status"] == "interrupted" and "killed without recording an end" in m["reason"], m["reason"]
    assert leftovers(run) == ""
    assert invoke("validate", str(run)).returncode == 0
