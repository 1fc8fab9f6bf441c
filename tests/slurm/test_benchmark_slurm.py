"""`invoke benchmark --executor slurm` on the single-node cluster: the tiny CPU benchmark as one batch job whose
supervisor runs in the job as a local run's (`--runtime local`).

- its records' generated token ids equal a local run's, and the manifest notes the job and its end state;
- `scancel` from outside, and SIGTERM of the submitting process, leave the run `interrupted` and nothing running;
- a supervisor killed outright in its job (a node crash's stand-in) is reported with Slurm's state and
  `invoke recover RUN`, which then finishes the run;
- a job past its Slurm time limit (forced below --max-seconds with the test-only DRAFTSCOPE_TEST_JOB_TIME_S)
  leaves the run `timed_out`: that job is started first and checked last, so that its minute (Slurm checks limits
  about every 30 s) passes while the other tests run;
- Slurm's refusals come before anything is written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from draftscope.bench.batch import TEST_TIME_ENV
from draftscope.core.jsonio import read_json
from draftscope.core.rundir import slurm_folder_of

from support import ROOT, processes_naming, tiny_benchmark

pytest.importorskip("transformers")

pytestmark = pytest.mark.slurm

QUICK = ("--max-new-tokens", "8", "--repeats", "1", "--warmups", "0")
LONG = ("--max-new-tokens", "256", "--repeats", "50", "--warmups", "0")  # minutes on one core: stopped midway
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # two jobs side by side on two cores


def argv(output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "invoke", *tiny_benchmark("local", "--output", str(output), *extra)]


def start(
    output: Path, *extra: str, env: dict[str, str] | None = None, stdout=subprocess.PIPE
) -> subprocess.Popen:
    return subprocess.Popen(
        argv(output, *extra, "--executor", "slurm"),
        cwd=ROOT,
        env=env or ENV,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(command: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def manifest(output: Path) -> dict:
    return read_json(output / "manifest.json")


def job_id(output: Path) -> str:
    return read_json(slurm_folder_of(output) / "jobs.json")["submissions"][-1]["jobs"][0]["job_id"]


def wait_for_records(output: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    path = output / "records.jsonl"
    while not (path.is_file() and path.stat().st_size):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no record appeared"
        time.sleep(0.2)


def leftovers(output: Path) -> list[str]:
    """Live processes whose command line names the run (its worker, its supervisor's job file)."""
    return processes_naming(str(output))


def assert_nothing_left(output: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while leftovers(output):
        assert time.monotonic() < deadline, f"left running: {leftovers(output)}"
        time.sleep(0.2)


def records(output: Path) -> dict[tuple[str, int], list[int]]:
    lines = (output / "records.jsonl").read_text().splitlines()
    return {(r["prompt_id"], r["repeat"]): r["generated_token_ids"] for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def past_its_limit(cluster, tmp_path_factory) -> Iterator[tuple[Path, subprocess.Popen, Path]]:
    """A long benchmark whose job may run one minute (--max-seconds stays 600 s), submitted when first asked for;
    its progress lines go to a file (a pipe nobody reads for a minute could fill up)."""
    folder = tmp_path_factory.mktemp("limit")
    output, log = folder / "run", folder / "stdout.txt"
    with log.open("w") as stdout:
        proc = start(output, *LONG, env={**ENV, TEST_TIME_ENV: "30"}, stdout=stdout)
    yield output, proc, log
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # cancels the job
        proc.communicate(timeout=120)


# --- a run ---------------------------------------------------------------------------------------------------------


def test_a_benchmark_through_slurm_equals_a_local_run(cluster, past_its_limit, tmp_path):
    local, remote = tmp_path / "local", tmp_path / "slurm"
    done = run(argv(local, *QUICK), cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    done = run(argv(remote, *QUICK, "--executor", "slurm"), cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    job = job_id(remote)
    assert f"slurm: submitted job {job} (ds-slurm-benchmark)" in done.stdout
    landed = [line for line in done.stdout.splitlines() if line.startswith("benchmark: 12/12 requests")]
    assert landed and "chat-multiturn repeat 0: 8 tokens" in landed[-1]  # the records, as they landed
    assert done.stdout.rstrip().endswith(f"{remote}: completed")

    assert records(remote) == records(local) and len(records(local)) == 12
    ran, here = manifest(remote), manifest(local)
    assert ran["status"] == "completed" and ran["config"] == here["config"]
    assert ran["command_line"][-2:] == ["--executor", "slurm"]
    assert [s["argv"] for s in ran["steps"]] == [
        [a.replace(str(local), str(remote)) for a in s["argv"]] for s in here["steps"]
    ]
    assert ran["notes"][0].startswith(f"supervised in Slurm job {job} on ")
    assert ran["notes"][-1].startswith(
        f"slurm: job {job} (ds-slurm-benchmark) ended COMPLETED (exit code 0:0"
    )
    checked = run([sys.executable, "-m", "invoke", "validate", str(remote)], cwd=ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # a note on a final run keeps it valid
    folder = slurm_folder_of(remote)
    assert sorted(p.name for p in folder.iterdir()) == [
        "benchmark.json",
        "benchmark.sbatch",
        "jobs.json",
        f"slurm-{job}.out",
    ]
    assert f"{remote}: completed" in (folder / f"slurm-{job}.out").read_text()
    again = run(argv(remote, *QUICK, "--executor", "slurm"), cwd=ROOT, env=ENV)
    assert again.returncode == 2 and "already exists" in again.stderr, again.stderr


# --- stopping the job ----------------------------------------------------------------------------------------------


def test_scancel_from_outside_leaves_the_run_interrupted(cluster, tmp_path):
    output = tmp_path / "run"
    proc = start(output, *LONG)
    wait_for_records(output, proc)
    assert run(["scancel", job_id(output)], timeout=30).returncode == 0
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert f"{output}: interrupted (job {job_id(output)} was cancelled (scancel)" in out
    assert manifest(output)["status"] == "interrupted"
    assert manifest(output)["notes"][-1].startswith(
        f"slurm: job {job_id(output)} (ds-run-benchmark) ended CANCELLED"
    )
    assert_nothing_left(output)


def test_sigterm_to_the_submitting_side_cancels_the_job(cluster, tmp_path):
    output = tmp_path / "run"
    proc = start(output, *LONG)
    wait_for_records(output, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert f"interrupted: cancelling job(s) {job_id(output)} (scancel)" in out
    assert (
        manifest(output)["status"] == "interrupted"
        and "was cancelled (scancel)" in manifest(output)["reason"]
    )
    assert run(["squeue", "-h", "-j", job_id(output)], timeout=30).stdout.strip() == ""
    assert_nothing_left(output)


def test_a_supervisor_killed_in_its_job_is_reported_with_invoke_recover(cluster, tmp_path):
    """SIGKILL of the supervisor inside the job stands in for a node crash: the run records no end."""
    output = tmp_path / "run"
    proc = start(output, *LONG)
    wait_for_records(output, proc)
    job_file = str(slurm_folder_of(output) / "benchmark.json")
    (pid,) = [int(p.split(":")[0]) for p in leftovers(output) if f"run-benchmark --job {job_file}" in p]
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert f"{output}: running (job {job_id(output)} failed (exit code 137" in out
    assert f"finish its record with `invoke recover {output}`" in out
    assert manifest(output)["status"] == "running" and "ended FAILED" in manifest(output)["notes"][-1]
    assert_nothing_left(output)  # the step went with its supervisor (and the job)
    recovered = run([sys.executable, "-m", "invoke", "recover", str(output)], cwd=ROOT)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert manifest(output)["status"] == "interrupted"


# --- refusals --------------------------------------------------------------------------------------------------------


def test_slurm_refuses_before_anything_is_written(cluster, tmp_path):
    output = tmp_path / "run"
    bad = run(argv(output, *QUICK, "--executor", "slurm", "--partition", "nope"), cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "--partition: Slurm refused job benchmark" in bad.stderr and "debug" in bad.stderr
    assert list(tmp_path.iterdir()) == []


# --- Slurm's time limit (last: its job has been running since the first test) ---------------------------------------


def test_a_job_past_its_slurm_time_limit_leaves_the_run_timed_out(past_its_limit):
    output, proc, log = past_its_limit
    _, err = proc.communicate(timeout=180)
    out = log.read_text()
    assert proc.returncode == 1, out + err
    job = job_id(output)
    assert f"benchmark: job {job} reached its Slurm time limit" in out
    assert f"{output}: timed_out (Slurm time limit of 00:01:00 reached (job {job})" in out
    ran = manifest(output)
    assert ran["status"] == "timed_out" and "TIMEOUT" in ran["notes"][-1]
    assert ran["config"]["max_seconds"] == 600  # the supervisor's own limit was far away
    assert "#SBATCH --time=0-00:01:00" in (slurm_folder_of(output) / "benchmark.sbatch").read_text()
    assert_nothing_left(output)
