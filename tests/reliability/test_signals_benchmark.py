"""Several stop signals in a row, and inputs edited mid-run, on real tiny benchmarks (`invoke benchmark --runtime
local`, CPU). Issue #18, acceptance 3.

Two or three Ctrl-C, or SIGTERM then Ctrl-C, sent to the command at seeded random moments of a phase the worker
announces in `worker.json` (loading, warm-up, generation, and the summary once the worker is done): the command must
exit 130 (SIGINT first) or 143 (SIGTERM first) with one line naming the run, and the run must end `interrupted` (or
`completed`, when the signals only reached the final write) with a summary `invoke validate` accepts, no supervisor
lock, no torn record and no worker left — or, if it could not be finished, be recoverable with the true reason.

Then the prompt file is edited, and deleted, while runs read it: each run must complete with the original prompts'
records and summary (the run reads only its own copy).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from draftscope.bench.recover import recover
from draftscope.core.jsonio import read_json
from draftscope.core.rundir import SUPERVISOR, liveness

from faultlib import (
    ROOT,
    alive,
    complete_lines,
    invoke_argv,
    read_lines,
    signal_name,
    start,
    wait_for_child,
    wait_for_lines,
    wait_until,
)
from support import run_invoke, tiny_benchmark

pytestmark = pytest.mark.reliability

TINY = tiny_benchmark("local", "--repeats", "1", "--max-new-tokens", "24", "--warmups", "3")
PROMPTS = ROOT / "examples" / "prompts.json"
TOTAL = len(read_json(PROMPTS)["prompts"])  # × 1 repeat
PHASES = ("loading", "warm-up", "generation", "summary")


@dataclass(frozen=True)
class Case:
    phase: str
    signals: tuple[int, ...]
    delay: float  # after the phase was seen
    gaps: tuple[float, ...]  # between the signals
    at_records: int = 0  # generation: after this many records

    def label(self) -> str:
        sigs = "+".join(signal_name(s) for s in self.signals)
        where = f"after {self.at_records} records" if self.phase == "generation" else self.phase
        return f"{sigs} during {where} (+{self.delay:.2f} s, gaps {', '.join(f'{g:.2f}' for g in self.gaps)})"


def draw_cases(seed: int) -> list[Case]:
    """Six launches: every phase at least once, every sequence (2×, 3× SIGINT; SIGTERM then SIGINT) at least twice."""
    rng = random.Random(f"{seed}:signals")
    sequences = [
        (signal.SIGINT, signal.SIGINT),
        (signal.SIGINT, signal.SIGINT, signal.SIGINT),
        (signal.SIGTERM, signal.SIGINT),
    ]
    phases = [*PHASES, rng.choice(PHASES), rng.choice(PHASES)]
    order = sequences * 2
    rng.shuffle(order)
    cases = []
    for phase, sigs in zip(phases, order, strict=True):
        cases.append(
            Case(
                phase,
                sigs,
                delay=rng.uniform(0.0, 0.3),
                gaps=tuple(rng.uniform(0.0, 0.4) for _ in sigs[1:]),
                at_records=rng.randint(1, TOTAL - 2),
            )
        )
    return cases


def worker_phase(run: Path) -> str | None:
    try:
        return json.loads((run / "worker.json").read_text())["phase"]
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class Observed:
    case: Case
    run: Path
    returncode: int
    output: str
    before: list[bytes]
    after: list[bytes]
    torn: int
    worker_alive: bool


def inject(case: Case, run: Path) -> Observed:
    log = run.with_suffix(".log")
    proc = start(invoke_argv(*TINY, "--output", str(run)), log=log)
    before: list[bytes] = []
    worker = None
    try:
        worker = wait_for_child(proc, "worker benchmark")
        wanted = {"loading": ("loading",), "warm-up": ("loaded",), "summary": ("done",)}
        if case.phase == "generation":
            wait_for_lines(run / "records.jsonl", case.at_records, proc)
        else:
            # The phase may pass before it is seen (warm-up is short): the next one is then as good a moment.
            later = {"loading": ("loaded", "measuring"), "warm-up": ("measuring",), "summary": ()}[case.phase]
            wait_until(
                lambda: worker_phase(run) in (*wanted[case.phase], *later),
                180,
                case.phase,
                poll=0.005,
                alive=proc,
            )
        time.sleep(case.delay)
        before = complete_lines(run / "records.jsonl")
        for i, sig in enumerate(case.signals):
            if i:
                time.sleep(case.gaps[i - 1])
            if proc.poll() is None:
                proc.send_signal(sig)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while worker is not None and alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    after, torn = read_lines(run / "records.jsonl")
    output = log.read_text(errors="replace")
    return Observed(
        case, run, proc.returncode, output, before, after, torn, worker is not None and alive(worker)
    )


def check(obs: Observed) -> None:
    case, run = obs.case, obs.run
    first = case.signals[0]
    assert obs.returncode == 128 + first, (obs.returncode, obs.output[-2000:])
    assert "Traceback" not in obs.output, obs.output[-3000:]
    last = [line for line in obs.output.splitlines() if line.strip()][-1]
    assert last.startswith(f"{run}: "), last
    assert obs.torn == 0, f"{obs.torn} torn record(s)"
    assert not obs.worker_alive, "the worker outlived the command"
    assert all(line in obs.after for line in obs.before), "a record seen before the signals was lost"
    manifest = read_json(run / "manifest.json")
    words = "SIGTERM" if first == signal.SIGTERM else "Ctrl-C"
    if manifest["status"] == "running":
        # Left for recover: it must say why (not blame a SIGKILL), be seen as unsupervised, and finish cleanly.
        assert "left unfinished" in last, last
        assert any(words in note for note in manifest["notes"]), manifest["notes"]
        assert liveness(run).state == "gone", liveness(run)
        manifest = recover(run, say=lambda line: None)
        assert manifest["reason"].startswith("its supervisor recorded: "), manifest["reason"]
    allowed = ("interrupted", "completed") if case.phase == "summary" else ("interrupted",)
    assert manifest["status"] in allowed, manifest
    assert f"{run}: {manifest['status']}" in last or "left unfinished" in last, last
    if manifest["status"] == "interrupted":
        assert words in manifest["reason"], manifest["reason"]
    summary = read_json(run / "summary.json")
    assert summary["records"] == len(obs.after), (summary["records"], len(obs.after))
    assert not (run / SUPERVISOR).exists(), "the supervisor lock was left behind"
    result = run_invoke("validate", str(run))
    assert result.returncode == 0, result.stdout + result.stderr


def test_repeated_stop_signals_at_random_moments(tmp_path, figures, seed):
    cases = draw_cases(seed)
    with ThreadPoolExecutor(2) as pool:  # two runs at a time: the machine has two cores
        observed = list(pool.map(lambda ic: inject(ic[1], tmp_path / f"run{ic[0]}"), enumerate(cases)))
    problems = []
    for obs in observed:
        try:
            with figures.fault("benchmark", obs.case.label()) as fault:
                fault.tear(obs.torn)
                fault.lose(sum(1 for line in obs.before if line not in obs.after))
                check(obs)
        except AssertionError as exc:
            problems.append(f"{obs.case.label()}: {exc}")
    assert not problems, "\n".join(problems)


# --- inputs edited mid-run ----------------------------------------------------------------------------------------


def edit_prompts(path: Path) -> None:
    """Another prompt set in the same place: a different count and different ids."""
    doc = read_json(path)
    doc["prompts"] = [{**p, "id": f"edited-{p['id']}"} for p in doc["prompts"][:3]]
    path.write_text(json.dumps(doc))


def run_while(change: str, folder: Path) -> tuple[int, str, Path]:
    folder.mkdir()
    prompts = folder / "prompts.json"
    shutil.copyfile(PROMPTS, prompts)
    run = folder / "run"
    argv = [*TINY, "--output", str(run)]
    argv[argv.index("--prompts") + 1] = str(prompts)
    log = folder / "log"
    proc = start(invoke_argv(*argv), log=log)
    try:
        wait_for_lines(run / "records.jsonl", 1, proc)
        if change == "edit":
            edit_prompts(prompts)
        else:
            prompts.unlink()
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, log.read_text(errors="replace"), run


@pytest.mark.parametrize("change", ["edit", "delete"])
def test_prompts_edited_or_deleted_mid_run_change_nothing(tmp_path, change):
    code, output, run = run_while(change, tmp_path / change)
    assert code == 0, output[-2000:]
    manifest = read_json(run / "manifest.json")
    assert manifest["status"] == "completed", manifest["reason"]
    ids = [p["id"] for p in read_json(PROMPTS)["prompts"]]
    records = [json.loads(line) for line in complete_lines(run / "records.jsonl")]
    assert [r["prompt_id"] for r in records] == ids
    summary = read_json(run / "summary.json")
    assert summary["records"] == len(ids) and summary["partial"] is False
    assert (run / "inputs" / "prompts.json").read_bytes() == PROMPTS.read_bytes()
