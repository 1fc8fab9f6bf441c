"""`invoke benchmark --runtime docker --executor slurm` on the single-node cluster with the real engine (podman
behind the docker CLI) and the kit's transformers image: the supervisor in the job runs the worker in its container.

- a run completes in the image, records its image id, validates, and leaves no container;
- `scancel` of a running job leaves the run `interrupted` with Slurm's reason and no container, not even a stopped
  one: the container is not a process of the job (the engine's service started it, without `--rm`), so Slurm's
  signals reach only its client, and the kit removes it (the job script's SIGTERM trap runs `cleanup-benchmark`;
  the supervisor stops and removes it by name).

Needs the engine and the image of the container tier (`make test-container` builds it; a cached rebuild here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.rundir import slurm_folder_of

from containerlib import docker
from support import ROOT, tiny_benchmark

pytestmark = pytest.mark.slurm

QUICK = ("--max-new-tokens", "8", "--repeats", "1", "--warmups", "0")
LONG = ("--max-new-tokens", "256", "--repeats", "50", "--warmups", "0")  # minutes: cancelled midway


def argv(output: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "invoke",
        *tiny_benchmark("docker", "--output", str(output), *extra),
        "--executor",
        "slurm",
    ]


def env() -> dict[str, str]:
    # The job inherits the submitter's environment (sbatch --export=ALL): DOCKER_HOST reaches the supervisor.
    return {**os.environ, "OMP_NUM_THREADS": "1", "HOME": "/tmp"}


def containers(output: Path, *flags: str) -> str:
    return docker(
        "ps", *flags, "--filter", f"label=draftscope.run={output.name}", "--format", "{{.Names}} {{.State}}"
    ).stdout.strip()


def job_id(output: Path) -> str:
    return read_json(slurm_folder_of(output) / "jobs.json")["submissions"][-1]["jobs"][0]["job_id"]


def test_a_container_benchmark_in_a_job_runs_in_the_image_and_leaves_nothing(cluster, kit_image, tmp_path):
    output = tmp_path / "crun"
    done = subprocess.run(
        argv(output, *QUICK), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = read_json(output / "manifest.json")
    assert ran["status"] == "completed" and ran["config"]["runtime"] == "docker"
    image_id = json.loads(docker("image", "inspect", kit_image).stdout)[0]["Id"]
    assert {i["step"]: i["id"] for i in ran["images"]} == {"benchmark": image_id}
    assert ran["notes"][-1].startswith(
        f"slurm: job {job_id(output)} (ds-{output.name}-benchmark) ended COMPLETED"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "invoke", "validate", str(output)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok   ../crun.slurm/jobs.json (slurm-jobs)" in checked.stdout
    assert containers(output, "--all") == ""


def test_scancel_of_a_container_benchmark_removes_its_container(cluster, kit_image, tmp_path):
    output = tmp_path / "cstop"
    proc = subprocess.Popen(
        argv(output, *LONG), cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        records = output / "records.jsonl"
        while not (records.is_file() and records.stat().st_size and "running" in containers(output)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job's container never produced a record"
            time.sleep(0.5)
        job = job_id(output)
        cancelled = subprocess.run(["scancel", job], capture_output=True, text=True, timeout=30, check=False)
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out + err
    assert f"{output}: interrupted (job {job} was cancelled (scancel)" in out, out + err
    ran = read_json(output / "manifest.json")
    assert ran["status"] == "interrupted" and "was cancelled (scancel)" in ran["reason"]
    deadline = time.monotonic() + 30  # podman removes a container asynchronously after it was stopped
    while containers(output, "--all"):
        assert time.monotonic() < deadline, f"left behind: {containers(output, '--all')}"
        time.sleep(0.5)
    assert (
        subprocess.run(
            ["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
        == ""
    )
