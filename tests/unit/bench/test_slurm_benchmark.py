"""`invoke benchmark --executor slurm` without a cluster: the dry run (the job script and the sbatch line, nothing
created), the job's resources and time limit from the plan, the flags shared with the pipeline, the node's checks
of the submitted benchmark, and a stop inside a job explained by Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftscope.bench import batch as benchmark
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.presets import load_experiment
from draftscope.execute.options import check_names, executor_flags
from draftscope.execute.slurm import node, states
from draftscope.runtime import Outcome

from support import run_invoke, sbatch_lines, tiny_benchmark

PYTHON = "/opt/kit/bin/python"
SHA = "0123456789abcdef0123456789abcdef01234567"


def tiny(**overrides):
    return load_experiment(
        "transformers-baseline",
        {
            "model_preset": "tiny",
            "device": "cpu",
            "runtime": "local",
            "prompts": "examples/prompts.json",
            **overrides,
        },
    )


def test_the_dry_run_prints_the_job_script_and_the_sbatch_line_and_creates_nothing(tmp_path):
    output = tmp_path / "runs" / "b1"
    done = run_invoke(
        *tiny_benchmark(
            "local", "--output", str(output), "--executor", "slurm", "--partition", "debug", "--dry-run"
        )
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    folder = f"{output}.slurm"
    assert lines[-2:] == ["# ===== submission", f"sbatch --parsable {folder}/benchmark.sbatch"]
    script = "\n".join(lines[lines.index(f"# ===== {folder}/benchmark.sbatch") + 1 : -3]) + "\n"
    found = sbatch_lines(script)
    assert found["output"] == f"{folder}/slurm-%j.out" and found["job-name"] == "ds-b1-benchmark"
    assert found["partition"] == "debug" and found["cpus-per-task"] == "1" and "gres" not in found
    assert found["time"] == "0-00:12:00"  # --max-seconds 600 + 120 s, whole minutes
    assert "--time: benchmark 600 s + 120 s" in script
    assert script.rstrip().endswith('"${kit[@]}" run-benchmark "${args[@]}" &\nchild=$!\nwait "$child"')
    assert f"args=(--job {folder}/benchmark.json)" in script and "cleanup-benchmark" not in script
    assert "worker benchmark --run-dir " + str(output) in script
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_gpu_benchmark_takes_a_node_and_its_gpus_and_a_limit_when_its_snapshots_are_cached(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    config = load_experiment(
        "vllm-int4-dflash2",
        {"revision": None, "model": "org/model", "max_seconds": 1800},
        [f"revision={SHA}", "vllm.tensor_parallel_size=2"],
    )
    flags = {"partition": "gpu", "account": "proj", "qos": "high"}
    bj = benchmark.build(config, Path("/shared/runs/v1"), flags=flags, python=PYTHON)
    found = sbatch_lines(benchmark.render(bj))
    assert (found["gres"], found["mem"], "exclusive" in found) == ("gpu:2", "0", True)
    assert (found["partition"], found["account"], found["qos"]) == ("gpu", "proj", "high")
    assert "time" not in found  # the snapshot is downloaded in the job: no limit of its own
    assert "cleanup-benchmark" in benchmark.render(bj)  # docker: the trap removes the containers
    for d in bj.plan.downloads:  # the target and the draft
        assert d.destination == str(tmp_path / "hub")
        (tmp_path / "hub" / f"models--{d.repo.replace('/', '--')}" / "snapshots" / d.revision).mkdir(
            parents=True
        )
    found = sbatch_lines(
        benchmark.render(benchmark.build(config, Path("/shared/runs/v1"), flags=flags, python=PYTHON))
    )
    assert found["time"] == "0-00:32:00"  # 1800 s + 120 s


def test_the_test_only_time_knob_sets_the_jobs_limit(monkeypatch):
    monkeypatch.setenv(benchmark.TEST_TIME_ENV, "30")
    bj = benchmark.build(tiny(), Path("/shared/r"), flags={}, python=PYTHON)
    assert sbatch_lines(benchmark.render(bj))["time"] == "0-00:01:00"
    assert benchmark.TEST_TIME_ENV in benchmark.render(bj)


def test_the_slurm_flags_are_the_pipelines():
    assert executor_flags("slurm", partition="gpu", account=None, qos="q") == {"partition": "gpu", "qos": "q"}
    with pytest.raises(UserError, match="--partition applies to the Slurm executor"):
        executor_flags("local", partition="gpu")
    with pytest.raises(UserError, match="unknown executor 'pbs'"):
        executor_flags("pbs")
    with pytest.raises(UserError, match="--account"):
        check_names({"account": "a b"})
    check_names({"partition": "gpu,long", "qos": "high-prio"})


def test_flags_without_the_slurm_executor_are_refused(tmp_path):
    done = run_invoke(*tiny_benchmark("local", "--output", str(tmp_path / "r"), "--qos", "high"))
    assert done.returncode == 2 and "--qos applies to the Slurm executor" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_node_refuses_a_benchmark_its_kit_plans_differently(tmp_path):
    bj = benchmark.build(tiny(), tmp_path / "run", flags={}, python=PYTHON)
    doc = benchmark.document(bj, ["invoke", "benchmark"])
    path = tmp_path / "benchmark.json"
    atomic_write_json(path, doc)
    loaded = benchmark.load(path)
    assert loaded.output == tmp_path / "run" and loaded.config == bj.plan.experiment
    atomic_write_json(path, {**doc, "prompts_sha256": "0" * 64})
    with pytest.raises(UserError, match="differs from the one submitted"):
        benchmark.load(path)
    atomic_write_json(path, {**doc, "steps": [{"name": "benchmark", "argv": ["python", "other"]}]})
    with pytest.raises(UserError, match="plans other steps"):
        benchmark.load(path)


def test_a_stop_inside_a_job_is_explained_by_slurm(monkeypatch):
    stopped = Outcome(
        "benchmark", "interrupted", None, 1.0, "terminated (SIGTERM); the step was stopped", None
    )
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert node.explain_stop(stopped) == stopped  # not in a job: as it was
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    limit = states.JobState("7", "COMPLETING", reason="TimeLimit", run_time="00:01:02", time_limit="00:01:00")
    monkeypatch.setattr(node, "own_state", lambda: limit)
    explained = node.explain_stop(stopped)
    assert explained.status == "timed_out" and explained.reason.startswith(
        "Slurm time limit of 00:01:00 reached"
    )
    monkeypatch.setattr(node, "own_state", lambda: states.JobState("7", "COMPLETING", reason="None"))
    assert node.explain_stop(stopped).reason == "job 7 was cancelled (scancel); the step was stopped"
    done = Outcome("benchmark", "completed", 0, 1.0, None, None)
    assert node.explain_stop(done) == done


@pytest.mark.parametrize(
    ("in_job", "kill_wait", "grace"),
    [(False, 5.0, 5.0), (True, 30.0, 5.0), (True, 5.0, 3.0), (True, 2.0, 1.0), (True, None, 5.0)],
)
def test_a_step_in_a_job_is_stopped_before_slurms_own_sigkill(monkeypatch, in_job, kill_wait, grace):
    """Inside a job the kit kills its step MARGIN_S before KillWait runs out, so that its record gets written."""
    from draftscope.execute.slurm import client

    monkeypatch.setattr(client, "kill_wait", lambda: kill_wait)
    if in_job:
        monkeypatch.setenv("SLURM_JOB_ID", "7")
    else:
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert node.stop_grace() == grace
    assert node.job_context(Path("/runs/w")).grace_seconds == grace


def test_kill_wait_is_read_from_scontrol(monkeypatch):
    import subprocess

    from draftscope.execute.slurm import client

    config = "Configuration data as of 2026-11-30T12:00:00\nJobAcctGatherType       = (null)\nKillWait                = 5 sec\n"
    monkeypatch.setattr(
        client, "_run", lambda argv, timeout=60.0: subprocess.CompletedProcess(argv, 0, config, "")
    )
    assert client.kill_wait() == 5.0
    monkeypatch.setattr(
        client, "_run", lambda argv, timeout=60.0: subprocess.CompletedProcess(argv, 1, "", "down")
    )
    assert client.kill_wait() is None
