"""hsextract as a Slurm job array, without a cluster: task I of N takes block I of N of the rows (speculators'
contiguous split, nested: its clients' ranks I*k+i of N*k cover exactly that block), servers on ports + I*k with
their own scratch folders, its own files; the tiny extractor gets `--world-size N --rank I`; the check job runs
`hsextract-check` after the array (`afterany`) and records failed tasks; a local run's argv is unchanged."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.execute.slurm.script import render
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.batch import jobs, shards
from draftscope.pipeline.config import load_pipeline_config
from draftscope.pipeline.stages import hsextract
from draftscope.pipeline.stages.hsextract.runner import block, client_rows
from draftscope.runtime import Outcome, get_runtime

from support import HEALTH_SERVER


def build(preset="qwen38-27b", stage="all", runtime="docker", slurm=None, workdir="/tmp/w"):
    resolved = load_pipeline_config(preset=preset, overrides={"slurm": slurm} if slurm else None)
    plan = planning.build(resolved, registry.select(stage), Path(workdir), runtime)
    return plan, jobs.build(plan, get_runtime(runtime), python="/opt/kit/bin/python")


def stage_plan(plan, name="hsextract"):
    return next(sp for sp in plan.stages if sp.stage.name == name)


def flag(argv, name):
    return argv[list(argv).index(name) + 1]


def scratch(server_argv):
    """Where a server's hidden-states connector writes (its `--kv-transfer-config`)."""
    transfer = json.loads(flag(server_argv, "--kv-transfer-config"))
    return transfer["kv_connector_extra_config"][hsextract.STORAGE_PATH_KEY]


# --- the split ----------------------------------------------------------------------------------------------------


def test_blocks_are_speculators_split_and_every_task_covers_its_clients_blocks():
    # speculators.data_generation.offline.get_indices_to_process: contiguous, the first `total % world` one longer
    assert [list(block(10, 4, r)) for r in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [list(block(2, 4, r)) for r in range(4)] == [[0], [1], [], []]

    def client(world, rank):
        return argparse.Namespace(argv=("speculators", "--world-size", str(world), "--rank", str(rank)))

    for total in range(0, 30):
        for n in range(1, 5):
            for k in range(
                1, 4
            ):  # task I's clients: ranks I*k … I*k+k-1 of N*k; the tasks partition the rows
                covered = []
                for i in range(n):
                    rows = client_rows([client(n * k, i * k + j) for j in range(k)], total)
                    covered += list(range(total)) if isinstance(rows, int) else rows
                assert sorted(covered) == list(range(total)), (total, n, k)
    with pytest.raises(UserError):
        block(10, 2, 2)


def test_the_runner_checks_the_rows_its_clients_cover():
    def client(world, rank):
        return argparse.Namespace(
            argv=("python", "-m", "speculators", "--world-size", str(world), "--rank", str(rank))
        )

    assert client_rows([client(2, 0), client(2, 1)], 10) == 10  # the whole stage: every row, as before
    assert client_rows([], 10) == 10
    assert client_rows([client(4, 2), client(4, 3)], 10) == [6, 7, 8, 9]  # task 1 of 2, two instances


# --- the array task's commands and step -------------------------------------------------------------------------


def test_a_task_of_a_real_preset_gets_its_ports_scratch_ranks_and_files():
    plan, _ = build(stage="hsextract")
    sp = stage_plan(plan)
    ctx = plan.context
    local = {c.name: c for c in sp.commands}
    k = sum(1 for c in sp.commands if c.port is not None)
    assert k == 2
    for shard in (0, 1):
        found = {c.name: c for c in shards.shard_commands(ctx, shard, 2, "hsextract")}
        assert sorted(found) == sorted(local)
        for i in range(k):
            server, client = found[f"server-{i}"], found[f"client-{i}"]
            assert server.port == local[f"server-{i}"].port + shard * k
            assert server.env == local[f"server-{i}"].env and server.gpus == local[f"server-{i}"].gpus
            assert scratch(server.argv) == ctx.layout.at("hsextract", "shards", str(shard), f"scratch-{i}")
            assert flag(client.argv, "--endpoint") == f"http://127.0.0.1:{server.port}/v1"
            assert (flag(client.argv, "--world-size"), flag(client.argv, "--rank")) == (
                "4",
                str(shard * k + i),
            )
            assert flag(client.argv, "--output") == ctx.layout.at("hidden_states")  # the shared folder
            expected = list(local[f"client-{i}"].argv)  # the rest of the argv is the local run's
            for name, value in (
                ("--endpoint", f"http://127.0.0.1:{server.port}/v1"),
                ("--world-size", "4"),
                ("--rank", str(shard * k + i)),
            ):
                expected[expected.index(name) + 1] = value
            assert list(client.argv) == expected
    step = shards.shard_step(sp, ctx, 1, 2)
    assert step.name == "hsextract.shard-1"
    argv = list(step.argv)
    assert flag(argv, "--commands") == ctx.layout.at("stages", "hsextract.shard-1.commands.json")
    assert flag(argv, "--result") == ctx.layout.at("stages", "hsextract.shard-1.result.json")
    assert flag(argv, "--summary") == ctx.layout.at("hsextract", "shards", "1", "summary.json")
    assert flag(argv, "--logs") == ctx.layout.at("logs", "hsextract.shard-1")
    assert flag(argv, "--output") == ctx.layout.at("hidden_states")
    assert "--world-size" not in argv  # the clients carry the ranks
    assert step.gpus == sp.step.gpus and step.image == sp.step.image


def test_a_local_run_is_unchanged():
    plan, _ = build(stage="hsextract")
    sp = stage_plan(plan)
    ctx = plan.context
    found = hsextract.instances(ctx)
    assert list(sp.commands) == [hsextract.server_command(ctx, i) for i in found] + [
        hsextract.client_command(ctx, i, len(found)) for i in found
    ]
    for i in found:
        default = hsextract.client_command(ctx, i, len(found))
        assert default == hsextract.client_command(ctx, i, len(found), rank=i.index)
        assert scratch(hsextract.server_command(ctx, i).argv) == ctx.layout.at(
            "hsextract", f"scratch-{i.index}"
        )
    assert sp.step.argv[3] == "hsextract" and "--world-size" not in sp.step.argv


def test_a_task_of_the_tiny_preset_runs_the_extractor_on_its_block(tmp_path):
    slurm = {"stages": {"hsextract": {"shards": 2}}}
    plan, jp = build(preset="tiny", runtime="local", slurm=slurm, workdir=str(tmp_path / "w"))
    sp = stage_plan(plan)
    ctx = plan.context
    assert shards.shard_commands(ctx, 1, 2, "hsextract") == []
    step = shards.shard_step(sp, ctx, 1, 2)
    argv = list(step.argv)
    assert argv[:4] == list(sp.step.argv[:4]) and argv[3] == "hsextract-transformers"
    assert argv[-4:] == ["--world-size", "2", "--rank", "1"]
    assert flag(argv, "--result") == ctx.layout.at("stages", "hsextract.shard-1.result.json")
    assert flag(argv, "--summary") == ctx.layout.at("hsextract", "shards", "1", "summary.json")
    assert flag(argv, "--output") == flag(sp.step.argv, "--output")
    # the extractor accepts what the task passes
    from draftscope.pipeline.__main__ import parser

    args = parser().parse_args(argv[3:])
    assert (args.world_size, args.rank) == (2, 1)
    assert (parser().parse_args(list(sp.step.argv[3:])).world_size) is None
    about = "\n".join(jp.job("hsextract").about)
    assert "block I of 2 of the rows (--world-size 2 --rank I)" in about


# --- jobs ---------------------------------------------------------------------------------------------------------


def test_the_array_and_its_check_job():
    _, jp = build(slurm={"nodes": 2, "partition": "gpu"})
    array, check = render(jp, jp.job("hsextract")), render(jp, jp.job("hsextract.check"))
    assert "#SBATCH --array=0-1" in array and "#SBATCH --gres=gpu:8" in array
    assert 'args=(--plan /tmp/w/slurm/plan.json --stage hsextract --shard "$SLURM_ARRAY_TASK_ID")' in array
    assert "--world-size 2*2 --rank I*2+i" in array and "ports + I*2" in array
    assert "#SBATCH --array" not in check and "--gres" not in check and "#SBATCH --cpus-per-task=1" in check
    assert "#SBATCH --time=0-00:30:00" in check and "#SBATCH --partition=gpu" in check
    assert '"${kit[@]}" check "${args[@]}" &' in check
    assert '"${kit[@]}" cleanup --check "${args[@]}"' in check
    shown = next(line for line in check.splitlines() if "hsextract-check" in line)
    assert "--gpus" not in shown and "--extractor vllm --hidden-size 5120" in shown
    assert "/draftscope/run/hsextract/summary.json" in shown
    from draftscope.pipeline.batch import planfile

    doc = planfile.document(jp, force=False)
    assert doc["stages"]["hsextract"]["kind"] == "shards" and doc["stages"]["hsextract"]["shards"] == 2
    assert "hsextract.check" not in doc["stages"]


def test_the_node_commands_parse():
    from draftscope.pipeline.batch.__main__ import parser

    args = parser().parse_args(["check", "--plan", "p", "--stage", "hsextract"])
    assert args.command == "check"
    args = parser().parse_args(["cleanup", "--check", "--plan", "p", "--stage", "hsextract"])
    assert args.check and args.shard is None


# --- the check job's outcome ------------------------------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path):
    plan, _ = build(preset="tiny", runtime="local", stage="hsextract", workdir=str(tmp_path / "w"))
    (plan.workdir / "stages").mkdir(parents=True)
    return plan


def task(plan, i, status="completed", written=3):
    shards.outcome_path(plan.workdir, i, "hsextract").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        shards.outcome_path(plan.workdir, i, "hsextract"),
        {
            "shard": i,
            "shards": 2,
            "status": status,
            "reason": None if status == "completed" else "exit 1",
            "seconds": 4.0 + i,
            "job_id": f"7_{i}",
            "array_job_id": "7",
        },
    )
    atomic_write_json(
        shards.result_path(plan.workdir, i, "hsextract"),
        {"counts": {"rows": 3, "written": written, "skipped": 3 - written, "files": 3}},
    )


def test_the_check_runs_after_every_task_completed_and_folds_their_counts(tiny):
    task(tiny, 0)
    task(tiny, 1, written=1)
    sp = stage_plan(tiny)
    ran = []

    def run(step, ctx):
        ran.append(step)
        atomic_write_json(
            tiny.workdir / "stages" / "hsextract.result.json",
            {
                "schema_version": 1,
                "stage": "hsextract",
                "exit_code": 0,
                "seconds": 0.5,
                "versions": {"x": "1"},
                "counts": {"rows": 6, "files": 6},
                "notes": [],
            },
        )
        return Outcome(step.name, "completed", 0, 0.5, None, None)

    outcome = shards.checked_outcome(tiny, sp, get_runtime("local"), 2, "8", run=run)
    assert outcome.ok and outcome.step == "hsextract" and outcome.seconds == pytest.approx(5.5)
    (step,) = ran
    assert step.name == "hsextract.check" and step.gpus == 0
    assert step.argv[3] == "hsextract-check" and flag(step.argv, "--extractor") == "transformers"
    assert flag(step.argv, "--summary") == flag(sp.step.argv, "--summary")
    assert flag(step.argv, "--result") == flag(sp.step.argv, "--result")
    result = read_json(tiny.workdir / "stages" / "hsextract.result.json")
    assert result["counts"] == {"rows": 6, "files": 6, "written": 4, "skipped": 2, "shards": 2}
    assert "Slurm job array 7 of 2 task(s)" in result["notes"][-1] and "job 8" in result["notes"][-1]


def test_a_failed_or_silent_task_fails_the_stage_without_checking(tiny, monkeypatch):
    from draftscope.execute.slurm import client

    monkeypatch.setattr(client, "show", lambda job_id: None)  # Slurm no longer knows the array (MinJobAge)
    sp = stage_plan(tiny)

    def run(step, ctx):
        raise AssertionError("the check must not run")

    task(tiny, 0)
    outcome = shards.checked_outcome(tiny, sp, get_runtime("local"), 2, "8", run=run)
    assert outcome.status == "failed" and "shard 1 of 2 ended without recording how" in outcome.reason
    task(tiny, 1, status="failed")
    outcome = shards.checked_outcome(tiny, sp, get_runtime("local"), 2, "8", run=run)
    assert outcome.status == "failed" and outcome.reason.startswith("shard 1 of 2 (job 7_1): failed")
    task(tiny, 1, status="timed_out")
    assert shards.checked_outcome(tiny, sp, get_runtime("local"), 2, "8", run=run).status == "timed_out"


def test_a_failed_check_fails_the_stage(tiny):
    task(tiny, 0)
    task(tiny, 1)

    def run(step, ctx):
        return Outcome(
            step.name, "failed", 2, 0.2, "exit code 2: 1 row(s) have no hidden-state file (rows 4)", None
        )

    outcome = shards.checked_outcome(tiny, stage_plan(tiny), get_runtime("local"), 2, "8", run=run)
    assert outcome.status == "failed" and outcome.step == "hsextract" and "(rows 4)" in outcome.reason


def test_hsextract_check_names_the_missing_rows(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    from draftscope.pipeline.stages.hsextract import runner as H

    out = tmp_path / "hidden_states"
    out.mkdir()
    for r in (0, 1, 2, 4):
        save_file(
            {"token_ids": torch.arange(3), "hidden_states": torch.zeros(3, 2, 8)},
            str(out / f"hs_{r}.safetensors"),
        )
    monkeypatch.setattr(H, "dataset_rows", lambda path: 5)
    args = argparse.Namespace(
        data="unused",
        output=str(out),
        summary=str(tmp_path / "s.json"),
        layer_ids=[1, 2],
        hidden_size=None,
        extractor="transformers",
    )
    with pytest.raises(UserError, match=r"1 row\(s\) have no hidden-state file \(rows 3\)"):
        H.check_main(args)
    save_file(
        {"token_ids": torch.arange(2), "hidden_states": torch.zeros(2, 2, 8)}, str(out / "hs_3.safetensors")
    )
    assert H.check_main(args) == {"rows": 5, "files": 5}
    assert read_json(tmp_path / "s.json") == {
        "schema_version": 1,
        "rows": 5,
        "files": 5,
        "layer_ids": [1, 2],
        "hidden_size": 8,
        "extractor": "transformers",
        "dtype": "float32",
    }


def test_a_task_of_a_complete_stage_starts_nothing(tmp_path, monkeypatch):
    """A resubmission for an earlier stage submits hsextract again; its tasks skip as the check job will."""
    from draftscope.pipeline.batch import commands as node
    from draftscope.pipeline.batch import planfile

    slurm = {"stages": {"hsextract": {"shards": 2}}}
    plan, jp = build(
        preset="tiny", runtime="local", stage="hsextract", slurm=slurm, workdir=str(tmp_path / "w")
    )
    path = planfile.write(jp, force=False)
    monkeypatch.setattr(jobs, "skip_reason", lambda *a: "completed earlier with the same inputs and command")
    monkeypatch.setattr(shards, "shard_commands", lambda *a: pytest.fail("the task must start nothing"))
    said = []
    assert node.run_step(path, "hsextract", shard=1, say=said.append) == 0
    outcome = read_json(shards.outcome_path(plan.workdir, 1, "hsextract"))
    assert outcome["status"] == "completed" and outcome["reason"].startswith("skipped (completed earlier")
    assert said == ["hsextract: shard 1 skipped (completed earlier with the same inputs and command)"]


BLOCK_CLIENT = """
import sys, torch
from safetensors.torch import save_file
from draftscope.pipeline.stages.hsextract.runner import block
world, rank = int(sys.argv[sys.argv.index("--world-size") + 1]), int(sys.argv[sys.argv.index("--rank") + 1])
for r in block(int(sys.argv[1]), world, rank):
    save_file({"token_ids": torch.arange(3), "hidden_states": torch.zeros(3, 2, 8)}, f"{sys.argv[2]}/hs_{r}.safetensors")
"""


def test_the_runner_of_a_task_checks_its_clients_blocks_only(tmp_path, monkeypatch):
    """Real presets: a task's runner (servers + its clients, ranks 2 and 3 of 4) checks the rows those clients
    cover and writes the task's summary; the other task's rows are not its to check."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    import json
    import socket

    from draftscope.pipeline.stages.hsextract import runner as H

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "hidden_states"
    commands = [
        {
            "name": "server-0",
            "argv": [sys.executable, "-c", HEALTH_SERVER, str(port)],
            "env": {},
            "gpus": [0],
            "port": port,
        }
    ]
    for i, rank in enumerate((2, 3)):
        commands.append(
            {
                "name": f"client-{i}",
                "env": {},
                "gpus": [],
                "port": None,
                "argv": [
                    sys.executable,
                    "-c",
                    BLOCK_CLIENT,
                    "10",
                    str(out),
                    "--world-size",
                    "4",
                    "--rank",
                    str(rank),
                ],
            }
        )
    path = tmp_path / "stages" / "hsextract.shard-1.commands.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"schema_version": 1, "commands": commands}))
    monkeypatch.setattr(H, "dataset_rows", lambda data: 10)
    summary = tmp_path / "hsextract" / "shards" / "1" / "summary.json"
    args = argparse.Namespace(
        commands=str(path),
        data="unused",
        output=str(out),
        summary=str(summary),
        layer_ids=[1, 2],
        hidden_size=8,
        startup_timeout=30.0,
        logs=str(tmp_path / "logs"),
    )
    assert H.main(args) == {"rows": 4, "files": 4}  # rows 6-9: blocks 2 and 3 of 4 over 10 rows
    assert sorted(p.name for p in out.iterdir()) == [f"hs_{r}.safetensors" for r in (6, 7, 8, 9)]
    assert read_json(summary)["rows"] == 4 and read_json(summary)["files"] == 4
