"""`StopSignals`: the first SIGINT/SIGTERM interrupts, later ones are only counted, the finalisation is bounded,
and a run that cannot be finished is left for `recover` with the true reason. In fresh interpreters: the handlers
it installs stay (ignored signals) once a signal was taken."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from draftscope.bench import options
from draftscope.bench.recover import recover
from draftscope.bench.stopping import unfinished
from draftscope.core.config import to_dict
from draftscope.core.jsonio import read_json
from draftscope.core.rundir import SUPERVISOR, InputFile, RunDir, liveness

from support import ROOT


def python(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )


def test_the_first_signal_interrupts_and_later_ones_are_counted():
    result = python(
        """
        import os, signal, sys
        from draftscope.runtime.base import Terminated, stop_signals
        with stop_signals() as s:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10**6): pass
                sys.exit("not interrupted")
            except Terminated:
                pass
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # the shield: counted, never raised
                os.kill(os.getpid(), sig)
            for _ in range(10**6): pass
        print(s.first, s.later, s.code)
        os.kill(os.getpid(), signal.SIGINT)  # ignored on the way out
        print("still here")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["15", "3", "143", "still", "here"]


def test_a_shielded_section_records_a_first_signal_without_raising():
    result = python(
        """
        import os, signal
        from draftscope.runtime.base import stop_signals
        with stop_signals() as s:
            s.shield()
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**6): pass
        print(s.code)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["130"]


def test_without_a_signal_the_previous_handlers_come_back():
    result = python(
        """
        import signal
        from draftscope.runtime.base import stop_signals
        before = signal.getsignal(signal.SIGINT)
        with stop_signals():
            pass
        print(signal.getsignal(signal.SIGINT) is before)
        """
    )
    assert result.stdout.split() == ["True"], result.stderr


def test_a_finalisation_past_its_bound_ends_the_process_with_its_reason():
    started = time.monotonic()
    result = python(
        """
        import os, signal, time
        from draftscope.runtime.base import stop_signals
        with stop_signals(bound=0.5) as s:
            s.on_expiry = lambda signum: print("expired", signum, flush=True)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                time.sleep(20)  # a finalisation that hangs
        """
    )
    assert time.monotonic() - started < 15
    assert result.returncode == 130 and result.stdout.split() == ["expired", "2"], result


def test_an_unfinished_run_is_left_for_recover_with_the_true_reason(tmp_path):
    """The step outlived SIGKILL: no summary, the status stays `running`, the notes and the lock file say why."""
    code = f"""
        import json, signal
        from pathlib import Path
        from draftscope.bench.stopping import unfinished
        from draftscope.core.rundir import RunDir
        run = RunDir.create(Path({str(tmp_path / "run")!r}), kind="head-bench", config={{}})
        run.set_status("running")
        manifest = unfinished(run, run.supervision, signal.SIGINT, "the step's process group 7 did not end")
        print(json.dumps(manifest["reason"]))
        """
    result = python(code)
    assert result.returncode == 0, result.stderr
    reason = json.loads(result.stdout)
    assert reason.startswith("interrupted by the user (Ctrl-C); the step's process group 7 did not end")
    run = tmp_path / "run"
    manifest = read_json(run / "manifest.json")
    assert manifest["status"] == "running" and reason in manifest["notes"]
    lock = json.loads((run / SUPERVISOR).read_text())
    assert lock["stopping"]["why"] == reason
    assert liveness(run).state == "gone"  # seen as unsupervised: `invoke recover` may finish it
    assert RunDir.open(run).manifest()["status"] == "running"


def test_recover_puts_the_recorded_stop_first(tmp_path):
    """A run left unfinished after a Ctrl-C: `recover` finishes it, and its reason starts with the true story."""

    config = options.experiment_config(
        backend="transformers",
        preset="tiny",
        device="cpu",
        runtime="local",
        prompts=str(ROOT / "examples/prompts.json"),
    )
    run = RunDir.create(
        tmp_path / "run",
        kind="benchmark",
        config=to_dict(config),
        inputs=[InputFile("prompts", Path(config.prompts))],
    )
    (run.path / "records.jsonl").touch()
    run.set_status("running")
    unfinished(run, run.supervision, signal.SIGINT, "the step's process group 7 did not end")
    manifest = recover(run.path, say=lambda line: None)
    assert manifest["status"] == "interrupted"
    assert manifest["reason"].startswith(
        "its supervisor recorded: interrupted by the user (Ctrl-C); the step's process group 7 did not end"
    ), manifest["reason"]
