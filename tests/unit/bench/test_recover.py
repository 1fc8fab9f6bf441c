"""A run whose supervisor was killed outright: told from a live one by its lock, finished by `invoke recover`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draftscope.bench.recover import recover
from draftscope.cli.runs import _liveness_line
from draftscope.core.errors import UserError
from draftscope.core.jsonio import iter_jsonl, read_json
from draftscope.core.rundir import SUPERVISOR, RunDir, Supervision, liveness
from draftscope.core.validate import validate_run

from support import ROOT

# A supervisor that dies by SIGKILL right before it would write the summary: every record is on disk, the manifest
# says `running`. `step` (JSON) is what it tells its lock about the running step.
KILLED = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path[:0] = [{tests!r}, {unit!r}]
    import test_analysis_synthetic as synthetic
    from draftscope.core.rundir import RunDir

    step = json.loads(sys.argv[2])
    create = RunDir.create.__func__

    def create_and_tell(cls, *args, **kwargs):
        run = create(cls, *args, **kwargs)
        if step:
            run.supervision.step("benchmark", **step)
        return run

    RunDir.create = classmethod(create_and_tell)
    RunDir.write_summary = lambda self, summary: os.kill(os.getpid(), signal.SIGKILL)
    from pathlib import Path
    synthetic.make_run(Path({path}), repeats=1, status=sys.argv[1], image={image})
    """
)
IMAGE = {"reference": "draftscope/transformers:0.1.0", "id": "sha256:" + "a" * 64, "repo_digests": []}


def killed_run(tmp_path: Path, *, step: dict | None = None, image: dict | None = None) -> Path:
    run = tmp_path / "killed"
    code = KILLED.format(
        tests=str(ROOT / "tests"),
        unit=str(ROOT / "tests" / "unit" / "analysis"),
        path=repr(str(run)),
        image=repr(image),
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "interrupted", json.dumps(step or {})], capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read_json(run / "manifest.json")["status"] == "running"
    return run


def records_in(run: Path) -> int:
    return sum(1 for _ in iter_jsonl(run / "records.jsonl"))


def test_the_creating_process_holds_the_lock_until_the_final_status(tmp_path):
    run = RunDir.create(tmp_path / "r1", kind="benchmark", config=_config(), argv=["t"])
    assert (run.path / SUPERVISOR).is_file()
    state = liveness(run.path)
    assert (
        state.state == "live"
        and state.info["pid"] == os.getpid()
        and state.info["host"] == socket.gethostname()
    )
    run.set_status("running")
    run.supervision.step("benchmark", pgid=12345)
    assert liveness(run.path).info["step"] == {"name": "benchmark", "pgid": 12345}
    run.set_status("interrupted", "test")
    assert not (run.path / SUPERVISOR).exists()
    assert liveness(run.path).state == "finished"


def test_a_killed_supervisor_is_told_from_a_live_one(tmp_path):
    run = killed_run(tmp_path)
    state = liveness(run)
    assert state.state == "gone"
    assert state.info["host"] == socket.gethostname() and state.info["pid"] != os.getpid()
    line = _liveness_line(str(run))
    assert "is gone without recording an end" in line and f"invoke recover {run}" in line


def test_recover_finishes_the_record_from_what_survived(tmp_path):
    run = killed_run(tmp_path)
    kept = records_in(run)
    assert kept > 0
    torn = b'{"schema_version": 1, "prompt_id": "cut sh'  # a kill mid-write
    with (run / "records.jsonl").open("ab") as fh:
        fh.write(torn)
    said: list[str] = []
    manifest = recover(run, say=said.append)
    assert manifest["status"] == "interrupted"
    assert "was killed without recording an end" in manifest["reason"]
    assert f"a torn last record ({len(torn)} bytes) was cut" in manifest["reason"]
    summary = read_json(run / "summary.json")
    assert summary["partial"] is True and summary["records"] == kept == records_in(run)
    assert validate_run(run, final=True).ok
    assert not (run / SUPERVISOR).exists() and not (run / ".space-reserve").exists()
    with pytest.raises(UserError, match="already ended"):
        recover(run)


def test_recover_refuses_a_live_run_and_names_its_supervisor(tmp_path):
    run = RunDir.create(tmp_path / "live", kind="benchmark", config=_config(), argv=["t"])
    run.set_status("running")
    before = (run.path / "manifest.json").read_bytes()
    with pytest.raises(UserError) as err:
        recover(run.path)
    assert f"kill -TERM {os.getpid()}" in err.value.render()
    assert (run.path / "manifest.json").read_bytes() == before


def test_a_run_without_a_lock_needs_force(tmp_path):
    run = killed_run(tmp_path)
    (run / SUPERVISOR).unlink()  # a run from a kit before the lock
    assert liveness(run).state == "unknown"
    with pytest.raises(UserError, match="--force"):
        recover(run)
    assert recover(run, force=True)["status"] == "interrupted"


def test_two_recoveries_cannot_run_at_once(tmp_path):
    run = killed_run(tmp_path)
    first = Supervision.adopt(run)
    try:
        with pytest.raises(UserError, match=f"being recovered by pid {os.getpid()}"):
            recover(run)
    finally:
        first.release()
    facts = liveness(run).info  # the dead supervisor's facts are kept, the recovery attempt added
    assert facts["pid"] != os.getpid() and facts["recovering"] == os.getpid()
    assert recover(run)["status"] == "interrupted"


def _sleeper(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", *argv], start_new_session=True
    )


def test_a_step_that_outlived_its_supervisor_is_stopped(tmp_path):
    run_path = tmp_path / "killed"
    step = _sleeper("--run-dir", str(run_path))  # names the run, as a local worker's argv does
    try:
        run = killed_run(tmp_path, step={"pgid": step.pid})
        manifest = recover(run, say=lambda line: None)
        assert step.wait(timeout=15) == -signal.SIGTERM
        assert f"the step's process group {step.pid} was stopped" in manifest["reason"]
    finally:
        step.kill()


def test_a_process_group_not_recognisably_the_runs_is_left_alone(tmp_path):
    other = _sleeper("--something-else")
    try:
        run = killed_run(tmp_path, step={"pgid": other.pid})
        with pytest.raises(UserError, match=f"process group {other.pid} is alive"):
            recover(run)
        manifest = recover(run, force=True)
        assert other.poll() is None and "left alone" in manifest["reason"]
    finally:
        other.kill()


def test_the_runs_containers_are_removed_by_label(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    engine = tmp_path / "bin" / "docker"
    engine.parent.mkdir()
    engine.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\ncase "$1" in ps) echo 0123456789abcdef;; esac\nexit 0\n'
    )
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{engine.parent}{os.pathsep}{os.environ['PATH']}")
    run = killed_run(tmp_path, step={"engine": "docker", "container": "ds-killed-benchmark"}, image=IMAGE)
    manifest = recover(run, say=lambda line: None)
    lines = calls.read_text().splitlines()
    assert lines == ["ps --all --quiet --filter label=draftscope.run=killed", "rm --force 0123456789abcdef"]
    assert "1 leftover container(s) removed" in manifest["reason"]


def test_an_engine_that_does_not_answer_stops_recovery_unless_forced(tmp_path, monkeypatch):
    engine = tmp_path / "bin" / "docker"
    engine.parent.mkdir()
    engine.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{engine.parent}{os.pathsep}{os.environ['PATH']}")
    run = killed_run(tmp_path, image=IMAGE)
    before = (run / "manifest.json").read_bytes()
    with pytest.raises(UserError, match="Cannot connect to the Docker daemon"):
        recover(run)
    assert (run / "manifest.json").read_bytes() == before and liveness(run).state == "gone"
    assert "were not checked" in recover(run, force=True, say=lambda line: None)["reason"]


def test_the_local_runtime_stops_its_step_when_the_supervisor_dies(tmp_path):
    """PR_SET_PDEATHSIG: a supervisor killed with SIGKILL takes its step with it (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is a Linux request")
    pidfile = tmp_path / "step.pid"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from draftscope.runtime.base import die_with_parent
        step = subprocess.Popen([sys.executable, "-c", "import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"],
                                start_new_session=True, preexec_fn=die_with_parent())
        time.sleep(120)
        """
    )
    supervisor = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.is_file() and pidfile.read_text()):
            assert time.monotonic() < deadline, "the step did not start"
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        supervisor.kill()
        supervisor.wait()
        deadline = time.monotonic() + 10
        while _running(pid):
            assert time.monotonic() < deadline, "the step outlived its supervisor"
            time.sleep(0.05)
    finally:
        supervisor.kill()


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _config() -> dict:
    return {"schema_version": 1, "name": "t", "backend": "transformers", "model_preset": "tiny"}


def test_analysis_says_a_killed_runs_supervisor_is_gone(tmp_path):
    from draftscope.analysis.load import load_run

    run = killed_run(tmp_path)
    (note,) = [n for n in load_run(run).notes if "supervisor" in n]
    assert "is gone without recording an end" in note and f"invoke recover {run}" in note
    recover(run, say=lambda line: None)
    assert not [n for n in load_run(run).notes if "supervisor" in n]


def test_liveness_of_a_run_the_reader_cannot_write(tmp_path, monkeypatch):
    import draftscope.core.rundir as rundir_module

    run = killed_run(tmp_path)
    real_open = os.open

    def no_write(path, flags, *args):  # as for another user's run (root would write anyway)
        if str(path).endswith(SUPERVISOR) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(rundir_module.os, "open", no_write)
    assert liveness(run).state == "gone"


# --- a planted lock or manifest (issue 18): nothing it names runs, nothing it numbers is signalled ---------------


def _canary(tmp_path: Path) -> tuple[Path, Path]:
    """A program that would leave a file if it ran; on PATH too, under its own name."""
    mark = tmp_path / "RAN"
    program = tmp_path / "bin" / "canary"
    program.parent.mkdir(exist_ok=True)
    program.write_text(f"#!/bin/sh\ntouch {mark}\necho 0123456789ab\n")
    program.chmod(0o755)
    return program, mark


def _plant_lock(run: Path, **facts) -> None:
    info = json.loads((run / SUPERVISOR).read_text())
    info.update(facts)
    (run / SUPERVISOR).write_text(json.dumps(info))


@pytest.mark.parametrize("engine", ["canary", "ABS", "sh", ["docker"]])
def test_a_lock_naming_a_program_is_refused_and_nothing_runs(tmp_path, monkeypatch, engine):
    program, mark = _canary(tmp_path)
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    run = killed_run(tmp_path)
    _plant_lock(run, step={"name": "benchmark", "engine": str(program) if engine == "ABS" else engine})
    before = (run / "manifest.json").read_bytes()
    for force in (False, True):
        with pytest.raises(UserError, match=r"step\.engine: names a program that is not a container engine"):
            recover(run, force=force)
    assert not mark.exists() and (run / "manifest.json").read_bytes() == before


@pytest.mark.parametrize(
    "facts, field",
    [
        ({"step": {"name": "benchmark", "pgid": True}}, "step.pgid"),
        ({"step": {"name": "benchmark", "pgid": -1}}, "step.pgid"),
        ({"step": {"name": "benchmark", "pgid": 0}}, "step.pgid"),
        ({"step": {"name": "benchmark", "pgid": "1"}}, "step.pgid"),
        ({"step": {"name": "benchmark", "pgid": 1 << 40}}, "step.pgid"),
        ({"step": "benchmark"}, "step"),
        ({"host": ["a"]}, "host"),
        ({"pid": 1.5}, "pid"),
    ],
)
def test_a_lock_with_implausible_facts_is_refused_by_field(tmp_path, facts, field):
    run = killed_run(tmp_path)
    _plant_lock(run, **facts)
    with pytest.raises(UserError, match=f"{field}: must be") as err:
        recover(run, force=True)
    assert "fix:" in err.value.render()


def test_a_lock_without_a_host_signals_nothing(tmp_path):
    other = _sleeper("--run-dir", str(tmp_path / "killed"))
    try:
        run = killed_run(tmp_path, step={"pgid": other.pid})
        info = json.loads((run / SUPERVISOR).read_text())
        del info["host"]
        (run / SUPERVISOR).write_text(json.dumps(info))
        with pytest.raises(UserError, match="records no host"):
            recover(run)
        manifest = recover(run, force=True, say=lambda line: None)
        assert other.poll() is None and "not checked" in manifest["reason"]
        assert "an unrecorded host" in manifest["reason"]
    finally:
        other.kill()


def test_a_group_whose_command_line_only_contains_the_runs_path_is_not_the_runs(tmp_path):
    """`/x/killed` is a substring of `/x/killed-other`: the old check would have signalled this group."""
    other = _sleeper("--run-dir", str(tmp_path / "killed-other"))
    try:
        run = killed_run(tmp_path, step={"pgid": other.pid})
        with pytest.raises(UserError, match="cannot be confirmed to be this run's"):
            recover(run)
    finally:
        other.kill()


def test_a_manifest_without_status_is_a_clean_error(tmp_path):
    run = killed_run(tmp_path)
    doc = json.loads((run / "manifest.json").read_text())
    del doc["status"]
    (run / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="status"):
        recover(run)
    (run / "manifest.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not of type 'object'"):
        recover(run)


@pytest.mark.parametrize("name", ["records.jsonl", SUPERVISOR, "manifest.json"])
def test_recovery_writes_through_no_link(tmp_path, name):
    run = killed_run(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes((run / name).read_bytes() + b'{"torn')
    (run / name).unlink()
    (run / name).symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(UserError, match="symbolic link"):
        recover(run, force=True)
    assert outside.read_bytes() == before


def test_a_lock_that_is_a_named_pipe_does_not_hang(tmp_path):
    run = killed_run(tmp_path)
    (run / SUPERVISOR).unlink()
    os.mkfifo(run / SUPERVISOR)
    assert liveness(run).state == "unknown"
    with pytest.raises(UserError, match="named pipe"):
        recover(run, force=True)
