"""Faults injected into real tiny benchmarks (`invoke benchmark --runtime local`, CPU): the worker or the supervisor
killed with SIGKILL, SIGTERM or SIGINT at seeded random points (a record count, or a moment during loading), and
the worker's own fault-injection exit after N records. Every run directory must validate as a partial run with
the right status and reason, keep every record it had (byte for byte), hold no torn line, and leave no process."""

from __future__ import annotations

import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from draftscope.bench.recover import recover
from draftscope.bench.worker import FAILPOINT
from draftscope.core.jsonio import read_json
from draftscope.core.rundir import SUPERVISOR, liveness
from draftscope.core.validate import validate_run

from faultlib import (
    alive,
    complete_lines,
    invoke_argv,
    kill_group,
    lost_from,
    read_lines,
    signal_name,
    start,
    wait_for_child,
    wait_for_lines,
)
from support import tiny_benchmark

pytestmark = pytest.mark.reliability

TINY = tiny_benchmark("local", "--repeats", "1", "--max-new-tokens", "32", "--warmups", "0")
TOTAL = 12  # examples/prompts.json × 1 repeat


@dataclass(frozen=True)
class Case:
    target: str  # worker | supervisor | all | failpoint
    sig: int | None = None
    at_records: int | None = None
    at_seconds: float | None = None  # after the worker process appeared (loading, warm-up)
    code: int | None = None  # failpoint exit code

    def label(self) -> str:
        when = (
            f"after {self.at_records} records"
            if self.at_records is not None
            else f"at +{self.at_seconds:.2f} s"
        )
        if self.target == "failpoint":
            return f"worker exits {self.code} {when} (failpoint)"
        return f"{self.target} {signal_name(self.sig)} {when}"  # type: ignore[arg-type]


def draw_cases(seed: int) -> list[Case]:
    rng = random.Random(f"{seed}:benchmark")

    def k() -> int:
        return rng.randint(0, TOTAL - 3)

    return [
        Case("worker", signal.SIGKILL, at_records=k()),
        Case("worker", signal.SIGKILL, at_records=k()),
        Case("worker", signal.SIGTERM, at_records=k()),
        Case("worker", signal.SIGKILL, at_seconds=rng.uniform(0.0, 2.5)),
        Case("worker", signal.SIGTERM, at_seconds=rng.uniform(0.0, 2.5)),
        Case("failpoint", at_records=k(), code=rng.randint(1, 120)),
        Case("failpoint", at_records=k(), code=rng.randint(1, 120)),
        Case("supervisor", signal.SIGTERM, at_records=k()),
        Case("supervisor", signal.SIGINT, at_records=k()),
        Case("all", signal.SIGKILL, at_records=k()),
        # The supervisor alone (the OOM killer's pick): its step must not run on unsupervised.
        Case("supervisor", signal.SIGKILL, at_records=k()),
    ]


@dataclass
class Observed:
    case: Case
    run: Path
    returncode: int
    before: list[bytes]
    after: list[bytes]
    torn: int
    worker_alive: bool


def inject(case: Case, run: Path) -> Observed:
    env = (
        {FAILPOINT: f"after-records:{case.at_records}:exit:{case.code}"} if case.target == "failpoint" else {}
    )
    proc = start(invoke_argv(*TINY, "--output", str(run)), env, log=run.with_suffix(".log"))
    records = run / "records.jsonl"
    worker = None
    before: list[bytes] = []
    try:
        if case.target != "failpoint":
            worker = wait_for_child(proc, "worker benchmark")
            if case.at_records is not None:
                wait_for_lines(records, case.at_records, proc)
            else:
                time.sleep(case.at_seconds or 0.0)
            before = complete_lines(records)
            if case.target == "worker":
                kill_group(worker, case.sig)  # type: ignore[arg-type]
            elif case.target == "supervisor":
                # SIGKILL here signals nothing else: the step must end by itself (checked below).
                proc.send_signal(case.sig)  # type: ignore[arg-type]
            else:  # everything at once: the host process and the step (an OOM kill, a lost node)
                proc.kill()
                kill_group(worker, signal.SIGKILL)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if worker is not None:
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
    after, torn = read_lines(records)
    return Observed(case, run, proc.returncode, before, after, torn, worker is not None and alive(worker))


def expected_status(case: Case) -> tuple[str, str | None]:
    """(status, a phrase the reason must hold)."""
    if case.target == "failpoint":
        return "failed", f"exited with code {case.code}"
    if case.target == "worker":
        return "failed", f"killed by {signal_name(case.sig)}"  # type: ignore[arg-type]
    if case.target == "supervisor" and case.sig != signal.SIGKILL:
        return "interrupted", "SIGTERM" if case.sig == signal.SIGTERM else "Ctrl-C"
    return "running", None  # nothing is left to record an ending: the records are what survives


def test_benchmark_faults(tmp_path, figures, seed):
    cases = draw_cases(seed)
    with ThreadPoolExecutor(2) as pool:  # two runs at a time: the machine has two cores
        observed = list(pool.map(lambda ic: inject(ic[1], tmp_path / f"run{ic[0]}"), enumerate(cases)))
    problems = []
    for obs in observed:
        case = obs.case
        try:
            with figures.fault("benchmark", case.label()) as fault:
                fault.tear(obs.torn)
                lost = lost_from(obs.before, obs.after)
                if case.target == "failpoint":
                    lost = case.at_records - len(obs.after)  # type: ignore[operator]
                fault.lose(lost)
                manifest = read_json(obs.run / "manifest.json")
                status, phrase = expected_status(case)
                assert manifest["status"] == status, manifest["reason"]
                assert phrase is None or phrase in manifest["reason"], manifest["reason"]
                assert obs.returncode != 0
                report = validate_run(obs.run)
                assert report.ok, report.first_failure()
                assert obs.torn == 0 and lost == 0, (obs.torn, lost)
                summary = obs.run / "summary.json"
                if status != "running":
                    facts = read_json(summary)
                    assert facts["partial"] is True and facts["records"] == len(obs.after)
                else:
                    assert not summary.exists()
                    # Told from a live run, then finished by `invoke recover` from what survived.
                    assert liveness(obs.run).state == "gone", liveness(obs.run)
                    manifest = recover(obs.run, say=lambda line: None)
                    assert manifest["status"] == "interrupted", manifest
                    assert "killed without recording an end" in manifest["reason"], manifest["reason"]
                    facts = read_json(summary)
                    assert facts["partial"] is True and facts["records"] == len(obs.after)
                    assert validate_run(obs.run, final=True).ok
                    assert not (obs.run / SUPERVISOR).exists()
                assert not obs.worker_alive, "the worker outlived the fault"
        except AssertionError as exc:
            problems.append(f"{case.label()}: {exc}")
    assert not problems, "\n".join(problems)
