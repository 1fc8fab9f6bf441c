"""The executor's interface without a planner: a chain of jobs built by hand (`execute.plan`) renders to job scripts
and sbatch lines, its ledger entries are schema-valid, Slurm's refusals name the planner's fields, and the executor
loads nothing of the packages above it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from draftscope.core.schema import problems
from draftscope.execute.plan import InJob, Job, JobChain, Placement, Resources, step_resources
from draftscope.execute.slurm import client
from draftscope.execute.slurm.launcher import POLL_INTERVAL_S
from draftscope.execute.slurm.ledger import Ledger, Submitted
from draftscope.execute.slurm.script import dependency, render, submission_lines
from draftscope.execute.slurm.states import JobState
from draftscope.runtime.step import Step

from support import sbatch_lines

FIELDS = {"resources": ("--size", "a smaller --size"), "time": ("--limit", "")}


def chain(tmp_path: Path) -> JobChain:
    def job(key: str, **more) -> Job:
        return Job(
            key=key,
            stage="work",
            kind=more.pop("kind", "step"),
            name=f"ex-{key}",
            resources=more.pop("resources", Resources(cpus_per_task=1)),
            run=more.pop("run", InJob("example.kit", "go", ("--file", str(tmp_path / "a b.json")))),
            script=tmp_path / f"{key}.sbatch",
            log=tmp_path / "logs" / f"{key}-{'%A_%a' if more.get('array_size') else '%j'}.out",
            chdir=tmp_path,
            fields=FIELDS,
            **more,
        )

    spread = InJob("example.kit", "go", ("--x",), cleanup="stop --hard", rendezvous=("--head", 4000))
    return JobChain(
        runtime="podman",
        python="/opt/py",
        jobs=(
            job("parts", kind="shards", array_size=3, about=("three parts",)),
            job("sum", kind="merge", after_any=("parts",)),
            job("wide", resources=Resources(nodes=2, gpus=4), run=spread, after_ok=("sum",)),
        ),
    )


def test_a_hand_built_chain_renders_as_its_jobs_say(tmp_path):
    c = chain(tmp_path)
    parts = render(c, c.job("parts"))
    assert sbatch_lines(parts)["array"] == "0-2" and sbatch_lines(parts)["output"].endswith("parts-%A_%a.out")
    assert "# three parts" in parts and "kit=(/opt/py -m example.kit)" in parts
    assert f"args=(--file '{tmp_path / 'a b.json'}')" in parts  # quoted; no task flag was asked for
    assert '"${kit[@]}" go "${args[@]}" &' in parts and "on_term" in parts and "stop" not in parts
    wide = render(c, c.job("wide"))
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --gres=gpu:4 --kill-on-bad-exit=1' in wide
    assert '"${kit[@]}" go "${args[@]}" --head "$head_node:4000" &' in wide
    assert '"${kit[@]}" stop --hard "${args[@]}"' in wide
    assert dependency(c.job("sum"), {"parts": "7"}) == "afterany:7"
    assert submission_lines(c)[2] == (
        f"wide=$(sbatch --parsable --dependency=afterok:$sum --kill-on-invalid-dep=yes {tmp_path}/wide.sbatch)"
    )


def test_an_array_task_learns_its_index_through_the_task_flag(tmp_path):
    c = chain(tmp_path)
    run = InJob("example.kit", "go", ("--file", "f"), task_flag="--part")
    job = Job(
        "p", "work", "shards", "ex-p", Resources(), run, tmp_path / "p", tmp_path / "p.out", tmp_path, 2
    )
    assert 'args=(--file f --part "$SLURM_ARRAY_TASK_ID")' in render(c, job)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_scripts_are_valid_bash(tmp_path):
    c = chain(tmp_path)
    for job in c.jobs:
        path = tmp_path / f"{job.key}.sh"
        path.write_text(render(c, job))
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_resources_from_a_step():
    gpu = Step(name="s", image="i", argv=("x",), gpus=-1)
    res = step_resources(gpu, Placement(partition="p"), all_gpus=8, seconds=90)
    assert (res.gpus, res.exclusive, res.mem, res.minutes, res.partition) == (8, True, "0", 3, "p")
    cpu = step_resources(Step(name="s", image="i", argv=("x",)), Placement(), all_gpus=8, seconds=None)
    assert (cpu.gpus, cpu.cpus_per_task, cpu.minutes) == (0, 1, None)


def test_the_ledger_keeps_the_chain_as_the_schema_says(tmp_path):
    c = chain(tmp_path)
    parts = Submitted(c.job("parts"), "7", None, tmp_path / "logs" / "parts-7_%a.out")
    parts.records = [JobState("7_0", "COMPLETED", exit_code="0:0", array_job_id="7", array_task="0")]
    parts.status = "completed"
    ledger = Ledger(tmp_path, tmp_path / "ledger" / "jobs.json")
    ledger.add(
        [parts, Submitted(c.job("sum"), "8", "afterany:7", tmp_path / "sum.out")],
        ["x"],
        runtime="podman",
        python="/opt/py",
    )
    entry = ledger.data["submissions"][0]["jobs"][0]
    assert (entry["array"], entry["log"], entry["kind"], entry["stage"]) == (
        "0-2",
        "logs/parts-7_%a.out",
        "shards",
        "work",
    )
    assert problems(ledger.data, "slurm-jobs") == []
    assert Ledger(tmp_path, ledger.path).data == ledger.data  # read back


def test_a_refusal_names_the_planners_fields():
    err = client.explain_refusal(
        "Requested node configuration is not available",
        job="sum",
        partition=None,
        account=None,
        qos=None,
        fields=FIELDS,
    )
    assert err.field == "--size" and "(a smaller --size)" in err.render()
    err = client.explain_refusal(
        "Requested time limit is invalid", job="sum", partition=None, account=None, qos=None, fields=FIELDS
    )
    assert err.field == "--limit"


def test_the_benchmarks_poll_interval_is_the_pipelines_default():
    from draftscope.pipeline.config import SlurmOptions

    assert SlurmOptions().poll_interval_s == POLL_INTERVAL_S


def test_the_executor_loads_nothing_above_it():
    """`lint-imports` checks the imports as written; this checks what loading the executor actually loads."""
    code = (
        "import json, sys, draftscope.execute.plan, draftscope.execute.slurm.launcher, "
        "draftscope.execute.slurm.node, draftscope.execute.options; "
        "print(json.dumps(sorted({m.split('.')[1] for m in sys.modules if m.startswith('draftscope.')})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not {"pipeline", "bench", "ops", "cli", "analysis"} & set(json.loads(done.stdout))
