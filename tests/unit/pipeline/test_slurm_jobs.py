"""The pipeline's Slurm jobs, without a cluster: job scripts (#SBATCH lines, the trap, srun + torchrun), the
dependency chain, the regen job array, resources from the Steps, the config rules, the plan file, and the dry run
of `--stage all --executor slurm` (issue #10, acceptance 1: prints everything, creates nothing, imports no torch,
fast)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.execute.plan import minutes
from draftscope.execute.slurm.script import dependency, render, slurm_time
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.batch import jobs, planfile, shards
from draftscope.pipeline.config import load_pipeline_config
from draftscope.runtime import ContainerRuntime, Context, get_runtime

from support import sbatch_lines, wall_bound

INVOKE_PIPELINE = (
    "from invoke import Collection, Program; from draftscope.cli.pipeline import PIPELINE_TASKS; "
    "Program(namespace=Collection(*PIPELINE_TASKS), binary='invoke').run()"
)
PYTHON = "/opt/kit/bin/python"


def build(preset="qwen38-27b", stage="all", runtime="docker", opts=(), workdir="/tmp/w", slurm=None):
    resolved = load_pipeline_config(preset=preset, opts=opts, overrides={"slurm": slurm} if slurm else None)
    plan = planning.build(resolved, registry.select(stage), Path(workdir), runtime)
    return jobs.build(plan, get_runtime(runtime), python=PYTHON)


# --- jobs and scripts -------------------------------------------------------------------------------------------


def test_one_job_per_stage_in_order_with_arrays_for_regen_and_hsextract():
    jp = build(slurm={"nodes": 2})
    assert [(j.key, j.kind) for j in jp.jobs] == [
        ("regen", "shards"),
        ("regen.merge", "merge"),
        ("pretokenize", "step"),
        ("prepare", "step"),
        ("hsextract", "shards"),
        ("hsextract.check", "check"),
        ("train", "torchrun"),
        ("convert", "step"),
        ("serve", "step"),
        ("bench", "step"),
    ]
    deps = {j.key: (j.after_ok, j.after_any) for j in jp.jobs}
    assert deps["regen"] == ((), ())
    assert deps["regen.merge"] == ((), ("regen",))  # runs however the shards ended, to record it
    assert deps["pretokenize"] == (("regen.merge",), ())
    assert deps["hsextract"] == (("prepare",), ())
    assert deps["hsextract.check"] == ((), ("hsextract",))
    assert deps["train"] == (("hsextract.check",), ())
    keys = [j.key for j in jp.jobs]
    for before, after in [*itertools.pairwise(keys[2:5]), *itertools.pairwise(keys[6:])]:
        assert deps[after] == ((before,), ())
    assert dependency(jp.job("regen.merge"), {"regen": "41"}) == "afterany:41"
    assert dependency(jp.job("hsextract.check"), {"hsextract": "44"}) == "afterany:44"
    assert dependency(jp.job("train"), {"hsextract.check": "45"}) == "afterok:45"
    assert jp.job("hsextract").array_size == 2 and jp.job("hsextract").array == "0-1"


def test_gpu_steps_take_whole_nodes_and_cpu_steps_one_cpu():
    jp = build(slurm={"nodes": 2, "partition": "gpu", "account": "proj", "qos": "high"})
    regen = sbatch_lines(render(jp, jp.job("regen")))
    assert regen["gres"] == "gpu:8" and "exclusive" in regen and regen["mem"] == "0"
    assert regen["array"] == "0-1" and regen["nodes"] == "1"
    assert regen["output"] == "/tmp/w/logs/slurm-regen-%A_%a.out"
    assert (regen["partition"], regen["account"], regen["qos"]) == ("gpu", "proj", "high")
    assert "time" not in regen  # no limit configured: the partition's default
    pre = sbatch_lines(render(jp, jp.job("pretokenize")))
    assert pre["cpus-per-task"] == "1" and "gres" not in pre and "exclusive" not in pre and "mem" not in pre
    assert pre["output"] == "/tmp/w/logs/slurm-pretokenize-%j.out" and pre["job-name"] == "ds-w-pretokenize"
    merge = sbatch_lines(render(jp, jp.job("regen.merge")))
    assert "gres" not in merge and merge["time"] == "0-00:30:00" and merge["partition"] == "gpu"


def test_time_limits_and_per_stage_overrides():
    jp = build(
        opts=[
            "time_limits.hsextract=3600",
            "slurm.stages.train.time_limit_s=86400",
            "slurm.stages.train.partition=long",
            "slurm.stages.train.nodes=4",
            "slurm.stages.prepare.mem=64G",
            "slurm.stages.prepare.cpus_per_task=16",
            "slurm.stages.regen.shards=3",
        ],
        slurm={"partition": "gpu"},
    )
    hs = sbatch_lines(render(jp, jp.job("hsextract")))
    assert hs["time"] == "0-01:01:00"  # the stage's own limit + a minute: the runtime stops it first
    train = sbatch_lines(render(jp, jp.job("train")))
    assert (train["time"], train["partition"], train["nodes"]) == ("1-00:00:00", "long", "4")
    prepare = sbatch_lines(render(jp, jp.job("prepare")))
    assert (prepare["mem"], prepare["cpus-per-task"], prepare["partition"]) == ("64G", "16", "gpu")
    assert sbatch_lines(render(jp, jp.job("regen")))["array"] == "0-2"


@pytest.mark.parametrize(("minutes", "text"), [(1, "0-00:01:00"), (61, "0-01:01:00"), (1441, "1-00:01:00")])
def test_slurm_time(minutes, text):
    assert slurm_time(minutes) == text


def test_minutes_round_up():
    assert [minutes(s) for s in (1, 60, 61, 3600.5)] == [1, 1, 2, 61]


def test_training_across_nodes_is_srun_and_torchrun_with_a_rendezvous():
    jp = build(slurm={"nodes": 2})
    script = render(jp, jp.job("train"))
    lines = sbatch_lines(script)
    assert lines["nodes"] == "2" and lines["ntasks-per-node"] == "1" and lines["gres"] == "gpu:8"
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --gres=gpu:8 --kill-on-bad-exit=1' in script
    assert '--rdzv-endpoint "$head_node:29500" &' in script
    shown = next(line for line in script.splitlines() if "speculators.train" in line)
    assert (
        "torchrun --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID --rdzv-backend c10d "
        "--rdzv-endpoint $head_node:29500 --rdzv-id $SLURM_JOB_ID --nproc_per_node 8 -m speculators.train"
    ) in shown
    assert (
        "--standalone" not in shown and "--network host" in shown
    )  # NCCL and the rendezvous talk between nodes


def test_torchrun_argv_replaces_only_the_standalone_launch():
    argv = (
        "python",
        "-m",
        "x",
        "--",
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        "8",
        "-m",
        "t",
        "--a",
        "1",
    )
    out = jobs.torchrun_argv(argv, nnodes="2", node_rank="1", endpoint="n1:29500", rdzv_id="7")
    assert out == (
        "python",
        "-m",
        "x",
        "--",
        "torchrun",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "n1:29500",
        "--rdzv-id",
        "7",
        "--nproc_per_node",
        "8",
        "-m",
        "t",
        "--a",
        "1",
    )
    with pytest.raises(UserError, match="no 'torchrun --standalone'"):
        jobs.torchrun_argv(("python", "-m", "t"), nnodes="2", node_rank="0", endpoint="h:1", rdzv_id="1")


def test_the_host_network_runtime_changes_only_the_network():
    ctx = Context(run_dir=Path("/tmp/w"), run_id="w")
    jp = build(slurm={"nodes": 2})
    step = next(sp for sp in jp.plan.stages if sp.stage.name == "train").step
    plain = get_runtime("podman").argv(step, ctx)
    host = ContainerRuntime("podman").with_host_network().argv(step, ctx)
    i = plain.index("--network")
    assert plain[i + 1] == "none" and host[: i + 1] == plain[: i + 1] and host[i + 1] == "host"
    assert host[i + 2 :] == plain[i + 2 :]


def test_the_cpu_path_trains_on_one_node_only():
    jp = build("tiny", stage="regen,pretokenize,train", runtime="local")
    assert jp.job("train").kind == "step"
    with pytest.raises(UserError, match="cannot span nodes") as err:
        build("tiny", stage="train", runtime="local", slurm={"nodes": 2})
    assert err.value.field == "--nodes"


def test_job_scripts_trap_sigterm_and_remove_the_container():
    jp = build(slurm={"nodes": 2})
    script = render(jp, jp.job("regen"))
    assert script.startswith("#!/bin/bash\n")
    assert f"kit=({PYTHON} -m draftscope.pipeline.batch)" in script
    assert 'args=(--plan /tmp/w/slurm/plan.json --stage regen --shard "$SLURM_ARRAY_TASK_ID")' in script
    assert '"${kit[@]}" cleanup "${args[@]}"' in script and "trap on_term TERM" in script
    assert script.index("trap on_term TERM") < script.index(
        '"${kit[@]}" run-step'
    )  # no window without the trap
    local = build("tiny", stage="regen,pretokenize", runtime="local", slurm={"nodes": 2})
    assert "cleanup" not in render(local, local.job("pretokenize"))  # no container to remove
    assert '"${kit[@]}" merge "${args[@]}" &' in render(jp, jp.job("regen.merge"))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_every_script_and_the_submission_lines_are_valid_bash(tmp_path):
    jp = build(slurm={"nodes": 2, "partition": "gpu"}, workdir=str(tmp_path / "my run"))
    for job in jp.jobs:
        path = tmp_path / f"{job.key}.sbatch"
        path.write_text(render(jp, job))
        checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    lines = jobs.dry_run_lines(jp)
    submission = lines[lines.index(next(x for x in lines if x.startswith("# ===== submission"))) + 1 :]
    (tmp_path / "submit.sh").write_text("\n".join(submission) + "\n")
    checked = subprocess.run(["bash", "-n", str(tmp_path / "submit.sh")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert (
        "'" + str(tmp_path / "my run" / "slurm" / "regen.sbatch") + "'" in submission[0]
    )  # a path with a space


# --- regen shards -------------------------------------------------------------------------------------------------


def test_a_shard_runs_the_stage_argv_with_its_own_rows_files_and_ports():
    jp = build("tiny", stage="regen", runtime="local", opts=["regen.base_port=9000"], workdir="/tmp/w")
    sp = jp.plan.stages[0]
    step = shards.shard_step(sp, jp.plan.context, 1, 3)
    base, argv = list(sp.step.argv), list(step.argv)
    assert step.name == "regen.shard-1" and argv[-4:] == ["--shard", "1", "--shards", "3"]
    changed = {argv[i - 1]: argv[i] for i in range(len(base)) if base[i] != argv[i]}
    assert changed == {
        "--result": "/tmp/w/stages/regen.shard-1.result.json",
        "--commands": "/tmp/w/stages/regen.shard-1.commands.json",
        "--output-dir": "/tmp/w/regen/shards/1",
    }
    assert argv[len(base) : len(base) + 2] == ["--logs", "/tmp/w/logs/regen.shard-1"]
    (server,) = shards.shard_commands(jp.plan.context, 2)
    assert server.port == 9002 and server.argv[server.argv.index("--port") + 1] == "9002"
    high = build("tiny", stage="regen", runtime="local", opts=["regen.base_port=65535"])
    with pytest.raises(UserError, match="would need port 65536"):
        shards.shard_commands(high.plan.context, 1)


# --- the plan file --------------------------------------------------------------------------------------------------


def test_a_job_rebuilds_the_submitted_plan_and_refuses_another(tmp_path):
    jp = build(
        "tiny",
        stage="regen,pretokenize",
        runtime="local",
        workdir=str(tmp_path / "w"),
        opts=["slurm.stages.regen.shards=2", "data.max_rows=5"],
    )
    path = planfile.write(jp, force=False)
    doc = read_json(path)
    assert doc["stages"]["regen"] == {
        "kind": "shards",
        "shards": 2,
        "nodes": 1,
        "argv": list(jp.plan.stages[0].step.argv),
    }
    loaded = planfile.load(path)
    assert [sp.step.argv for sp in loaded.plan.stages] == [sp.step.argv for sp in jp.plan.stages]
    assert loaded.plan.config == jp.plan.config and loaded.runtime.name == "local"
    doc["stages"]["pretokenize"]["argv"][-1] = "999"
    path.write_text(__import__("json").dumps(doc))
    with pytest.raises(UserError, match="plans another command for stage pretokenize"):
        planfile.load(path)


# --- config rules ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opt", "message"),
    [
        ("slurm.stages.regen.nodes=2", "only the train stage spans several nodes"),
        ("slurm.stages.train.shards=2", "only regen and hsextract run as a job array"),
        ("slurm.partition='gpu nodes'", "slurm.partition"),
        ("slurm.mem=64GB", "slurm.mem"),
        ("slurm.stages.trian.nodes=2", "slurm.stages"),
        ("slurm.nodes=0", "slurm.nodes"),
    ],
)
def test_bad_slurm_settings_are_one_line_errors(opt, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_pipeline_config(preset="qwen38-27b", opts=[opt])


# --- through invoke -------------------------------------------------------------------------------------------------


def run_task(*args, cwd, extra_env=None, timeout=60):
    env = {**os.environ, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, "pipeline", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_dry_run_of_all_stages_prints_scripts_and_sbatch_lines_creates_nothing_imports_no_torch(tmp_path):
    """Acceptance 1 of issue #10."""
    tripwire = tmp_path / "tripwire"
    for name in ("torch", "transformers", "vllm", "sglang", "speculators"):
        (tripwire / name).mkdir(parents=True)
        (tripwire / name / "__init__.py").write_text(f"raise ImportError('tripwire: {name} imported')\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # An empty hub cache, so that the target's download is planned as the first job on any machine.
    env = {"PYTHONPATH": str(tripwire), "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    started = time.monotonic()
    result = run_task(
        "--stage",
        "all",
        "--executor",
        "slurm",
        "--nodes",
        "2",
        "--partition",
        "gpu",
        "--dry-run",
        cwd=cwd,
        extra_env=env,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("#!/bin/bash") == 11 and out.count("#SBATCH --partition=gpu") == 11
    assert out.count("#SBATCH --array=0-1") == 2 and out.count("#SBATCH --array=") == 2  # regen and hsextract
    assert "srun --nodes=" in out and "torchrun --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID" in out
    submitted = [line for line in out.splitlines() if "=$(sbatch --parsable" in line]
    names = [line.split("=", 1)[0] for line in submitted]
    assert names == [
        "fetch",
        "regen",
        "regen_merge",
        "pretokenize",
        "prepare",
        "hsextract",
        "hsextract_check",
        "train",
        "convert",
        "serve",
        "bench",
    ]
    assert "--dependency" not in submitted[0]
    assert "--dependency=afterok:$fetch --kill-on-invalid-dep=yes" in submitted[1]
    assert "--dependency=afterany:$regen --kill-on-invalid-dep=yes" in submitted[2]
    assert "--dependency=afterany:$hsextract --kill-on-invalid-dep=yes" in submitted[6]
    for before, line in zip(names[2:], submitted[3:], strict=False):
        if not line.startswith("hsextract_check="):
            assert f"--dependency=afterok:${before} --kill-on-invalid-dep=yes" in line
    assert "hsextract.check.sbatch" in submitted[6] and '"${kit[@]}" check "${args[@]}" &' in out
    assert list(cwd.iterdir()) == []  # no workdir, no file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "tripwire"]
    assert elapsed < wall_bound(
        3.0
    )  # the command itself takes well under a second; the bound absorbs a loaded CI machine
    plain = run_task("--stage", "all", "--executor", "slurm", "--dry-run", cwd=cwd, extra_env=env)
    assert (
        plain.returncode == 0
        and plain.stdout.count("#SBATCH --array=0-0") == 2
        and "srun --nodes=" in plain.stdout
    )
    assert list(cwd.iterdir()) == []


def test_dry_run_in_process_is_well_under_a_second():
    from draftscope.pipeline.batch import submit

    resolved = load_pipeline_config(preset="qwen38-27b", overrides={"slurm": {"nodes": 4}})
    started = time.monotonic()
    plan = planning.build(resolved, registry.select("all"), Path("/tmp/w"), "docker")
    lines = submit.dry_run_lines(plan, get_runtime("docker"))
    assert time.monotonic() - started < wall_bound(0.5) and len(lines) > 100


def test_flag_errors_are_one_line(tmp_path):
    result = run_task("--stage", "regen", "--partition", "gpu", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert (
        "--partition applies to the Slurm executor" in result.stderr and "--executor slurm" in result.stderr
    )
    result = run_task("--executor", "pbs", "--dry-run", cwd=tmp_path)
    assert (
        result.returncode == 2
        and "unknown executor 'pbs'" in result.stderr
        and "local, slurm" in result.stderr
    )
    result = run_task("--executor", "slurm", "--nodes", "two", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2 and "--nodes: expected an integer" in result.stderr


def test_without_sbatch_a_submission_says_how_to_get_it(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_task(
        "--preset",
        "tiny",
        "--stage",
        "pretokenize",
        "--executor",
        "slurm",
        "--workdir",
        str(tmp_path / "w"),
        cwd=tmp_path,
        extra_env={"PATH": str(empty)},
    )
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "'sbatch' is not on PATH" in result.stderr and "apt-get install slurm-client" in result.stderr
    assert not (tmp_path / "w").exists()
