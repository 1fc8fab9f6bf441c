"""Containment in the argv of every step every plan builds (issue #18, "Containers"): every benchmark experiment
preset × model preset, every pipeline model preset × draft type (with its fetch step, the Slurm shards, check and
torchrun template), through docker and podman, invoked as root and as a user.

Each container step must carry a read-only root with the tmpfs /tmp, its memory (swap equal), pids and shm limits
(shm not when it shares the host's IPC), never uid 0, and a credential only when it is a fetch step with network.
The real engine shows the same flags at work: tests/container/test_containment.py.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

import pytest

from draftscope.bench.plan import plan_benchmark
from draftscope.core.errors import UserError
from draftscope.core.platforms import IMAGE_USER
from draftscope.core.presets import experiment_preset_names, load_experiment, model_preset_names
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.batch import jobs, shards
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.runtime import ContainerRuntime, Context
from draftscope.runtime.container import TMPFS, container_user, hand_over
from draftscope.runtime.step import (
    CPU_LIMITS,
    CREDENTIALS,
    FETCH_LIMITS,
    GPU_LIMITS,
    HUB_NETWORK,
    Limits,
    Step,
)

EXPERIMENTS = experiment_preset_names()
PRESETS = model_preset_names()
USERS = [(0, 0), (1000, 1000)]
ENGINES = ["docker", "podman"]


def value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def benchmark_steps() -> list[Step]:
    steps = []
    for name in EXPERIMENTS:
        for preset in PRESETS:
            try:
                config = load_experiment(name, {"model_preset": preset})
                steps += plan_benchmark(config, "/runs/r").steps
            except UserError:
                continue  # a combination the kit refuses (e.g. an INT4 experiment on a preset without INT4)
    return steps


def pipeline_steps() -> list[Step]:
    steps = []
    for preset in PRESETS:
        for draft in DRAFTS:
            resolved = load_pipeline_config(draft=draft, preset=preset)
            plan = planning.build(resolved, registry.select("all"), Path("/w"), "docker")
            fetch = planning.fetch_step(plan)
            steps += [fetch] if fetch is not None else []
            for sp in plan.stages:
                steps.append(sp.step)
                if sp.stage.name in (shards.STAGE, shards.HSEXTRACT):
                    steps += [shards.shard_step(sp, plan.context, 0, 2), shards.check_step(sp, plan.context)]
                if jobs.kind_of(sp) == "torchrun":
                    steps.append(jobs.torchrun_template(sp.step, resolved.config.slurm.rdzv_port))
    return steps


STEPS = benchmark_steps() + pipeline_steps()


def test_the_walk_covers_fetch_cpu_and_gpu_steps():
    names = {s.name for s in STEPS}
    assert "fetch" in names and "benchmark" in names and set(registry.NAMES) <= names
    assert {s.gpus != 0 for s in STEPS} == {True, False}
    assert len(STEPS) > 100


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("user", USERS, ids=["root", "user"])
def test_every_step_is_contained(engine, user, monkeypatch):
    for key in CREDENTIALS:
        monkeypatch.setenv(key, "hf_planted")
    ctx = Context(run_dir=Path("/runs/r"), run_id="r", user=user)
    runtime = ContainerRuntime(engine)
    for step in STEPS:
        argv = runtime.argv(step, ctx)
        assert "--read-only" in argv, step.name
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--tmpfs"] == list(TMPFS), step.name
        assert value(argv, "--memory") == value(argv, "--memory-swap") == step.limits.memory, step.name
        assert value(argv, "--pids-limit") == str(step.limits.pids), step.name
        if step.ipc_host:
            assert "--shm-size" not in argv and value(argv, "--ipc") == "host", step.name
        else:
            assert value(argv, "--shm-size") == step.limits.shm_size, step.name
        uid, gid = (int(x) for x in value(argv, "--user").split(":"))
        assert uid != 0 and gid != 0, (step.name, argv)
        assert value(argv, "--cap-drop") == "ALL" and value(argv, "--security-opt") == "no-new-privileges"
        envs = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
        passed = {e.partition("=")[0] for e in envs} & set(CREDENTIALS)
        assert all("hf_planted" not in a for a in argv), step.name  # by name only, never a value
        if step.name == "fetch":
            assert step.network and step.credentials == CREDENTIALS and passed == set(CREDENTIALS)
            assert "--network" not in argv
        else:
            assert step.credentials == () and passed == set(), (step.name, passed)


def test_credentials_cannot_reach_a_step_any_other_way():
    with pytest.raises(ValueError, match="without network"):
        Step("worker", "transformers", ("true",), credentials=CREDENTIALS)
    with pytest.raises(ValueError, match=r"Step\.credentials"):
        Step("worker", "transformers", ("true",), env_passthrough=("HF_TOKEN",), network=True)
    with pytest.raises(ValueError, match=r"Step\.credentials"):
        Step("worker", "transformers", ("true",), env={"HUGGING_FACE_HUB_TOKEN": "x"})


def test_the_default_limits_per_step_kind():
    config = load_experiment("transformers-baseline", {"model_preset": "qwen3-8b"})
    fetch, bench = plan_benchmark(config, "/runs/r").steps
    assert (fetch.limits, bench.limits) == (FETCH_LIMITS, GPU_LIMITS)
    tiny = load_experiment("tiny-cpu")
    (bench,) = plan_benchmark(tiny, "/runs/r").steps
    assert bench.limits == CPU_LIMITS


def test_a_config_sets_the_limits_of_every_step():
    opts = ["container.memory=24g", "container.pids=2048", "container.shm_size=512m"]
    config = load_experiment("transformers-baseline", {"model_preset": "qwen3-8b"}, opts=opts)
    want = Limits(memory="24g", pids=2048, shm_size="512m")
    assert {s.limits for s in plan_benchmark(config, "/runs/r").steps} == {want}
    resolved = load_pipeline_config(preset="qwen3-8b", opts=opts)
    plan = planning.build(resolved, registry.select("all"), Path("/w"), "docker")
    assert {sp.step.limits for sp in plan.stages} | {planning.fetch_step(plan).limits} == {want}
    only = load_experiment("tiny-cpu", opts=["container.memory=2g"])
    (bench,) = plan_benchmark(only, "/runs/r").steps
    assert bench.limits == dataclasses.replace(CPU_LIMITS, memory="2g")


@pytest.mark.parametrize(
    ("opt", "field"),
    [
        ("container.memory=32", "container.memory"),  # no unit
        ("container.memory=8gb", "container.memory"),
        ("container.memory=-1g", "container.memory"),
        ("container.memory=63m", "container.memory"),  # under the floor: the dataclass's own rule
        ("container.memory=1k", "container.memory"),
        ("container.memory=9999999999g", "container.memory"),  # too many digits
        ("container.pids=0", "container.pids"),
        ("container.pids=63", "container.pids"),
        ("container.pids=5000000", "container.pids"),
        ("container.pids=many", "container.pids"),
        ("container.shm_size=1t", "container.shm_size"),
        ("container.swap=1g", "container"),
    ],
)
@pytest.mark.parametrize("kind", ["experiment", "pipeline"])
def test_a_bad_limit_is_refused_by_field(opt, field, kind):
    with pytest.raises(UserError) as caught:
        if kind == "experiment":
            load_experiment("tiny-cpu", opts=[opt])
        else:
            load_pipeline_config(preset="tiny", opts=[opt])
    text = caught.value.render() if hasattr(caught.value, "render") else str(caught.value)
    assert field in text and "fix" in text, text
    assert "\n" not in text.strip()


PROXY = "http://user:proxy-secret@127.0.0.1:3128"  # a proxy address may hold a password: never shown


def test_the_dry_runs_show_the_fetch_step_with_its_credential_names(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_planted")
    monkeypatch.setenv("HTTPS_PROXY", PROXY)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/mirror-planted")
    resolved = load_pipeline_config(preset="qwen3-8b")
    plan = planning.build(resolved, registry.select("all"), Path("/w"), "docker")
    lines = planning.dry_run_lines(plan, ContainerRuntime("docker"))
    at = next(i for i, line in enumerate(lines) if line.startswith("# [fetch] "))
    assert "network on" in lines[at]
    assert (
        lines[at + 2] == "#   credentials by name (values never recorded): HF_TOKEN, HUGGING_FACE_HUB_TOKEN"
    )
    assert lines[at + 3] == (
        "#   proxy and mirror by name (values never recorded): "
        "HF_ENDPOINT, HTTPS_PROXY, https_proxy, HTTP_PROXY, http_proxy, NO_PROXY, no_proxy"
    )
    fetch = shlex.split(lines[at + 4])
    assert fetch[:2] == ["docker", "run"] and "--network" not in fetch and "HF_TOKEN" in fetch
    # the ones set are passed by name (`--env NAME`): the engine copies the value
    assert (
        fetch[fetch.index("HTTPS_PROXY") - 1] == "--env" and fetch[fetch.index("HF_ENDPOINT") - 1] == "--env"
    )
    first_stage = next(i for i, line in enumerate(lines) if line.startswith("# [1/8]"))
    assert at < first_stage
    assert all("HF_TOKEN" not in line and "PROXY" not in line for line in lines[first_stage:])
    assert all(s not in line for line in lines for s in ("hf_planted", "proxy-secret", "mirror-planted"))


def test_the_benchmark_plan_lists_the_fetch_step_first_with_its_credentials():
    from draftscope.cli.render import step_lines

    config = load_experiment("transformers-baseline", {"model_preset": "qwen3-8b"})
    fetch, bench = plan_benchmark(config, "/runs/r").steps
    shown = step_lines(fetch)
    assert "network on" in shown[0]
    assert "    credentials by name (values never recorded): HF_TOKEN, HUGGING_FACE_HUB_TOKEN" in shown
    assert not any("credentials" in line for line in step_lines(bench))
    assert "    env by name (values never recorded): " + ", ".join(HUB_NETWORK) in shown
    assert not any(name in line for line in step_lines(bench) for name in HUB_NETWORK)
    assert any("memory 256g (no swap), pids 16384, shm 16g" in line for line in step_lines(bench))


@pytest.mark.parametrize("name", HUB_NETWORK)
def test_the_hub_network_settings_reach_no_step_without_network(name):
    with pytest.raises(ValueError, match="without network is given the hub's network settings"):
        Step(name="worker", image="vllm", argv=("python",), env_passthrough=(name,))
    Step(name="fetch", image="transformers", argv=("python",), env_passthrough=(name,), network=True)


def test_root_never_runs_as_root_inside():
    assert container_user((0, 0)) == IMAGE_USER
    assert container_user((0, 5)) == IMAGE_USER
    assert container_user((1000, 0)) == (1000, IMAGE_USER[1])
    assert container_user((1000, 1000)) == (1000, 1000)


@pytest.mark.skipif(getattr(os, "geteuid", lambda: 1)() != 0, reason="changing owners needs root")
def test_hand_over_changes_the_tree_and_nothing_it_links_to(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "sub").mkdir(parents=True)
    outside.mkdir()
    (run / "sub" / "records.jsonl").write_text("{}\n")
    secret = outside / "secret"
    secret.write_text("x")
    (run / "link-to-outside").symlink_to(outside)
    (run / "link-to-secret").symlink_to(secret)
    os.link(secret, run / "hardlink-to-secret")
    hand_over(run, (4321, 4321))
    for path in (run, run / "sub", run / "sub" / "records.jsonl", run / "link-to-outside"):
        assert path.lstat().st_uid == 4321, path
    for path in (outside, secret):
        assert path.stat().st_uid == 0, path  # neither the symlinks' targets nor a hard-linked file
    assert (run / "hardlink-to-secret").lstat().st_uid == 0


def test_the_local_runtime_gives_credentials_to_the_fetch_step_only(monkeypatch):
    from draftscope.runtime.local import LocalRuntime

    monkeypatch.setenv("HF_TOKEN", "hf_planted")
    config = load_experiment("transformers-baseline", {"model_preset": "qwen3-8b"})
    fetch, bench = plan_benchmark(config, "/runs/r").steps
    ctx = Context(run_dir=Path("/runs/r"), run_id="r")
    assert LocalRuntime().env(fetch, ctx)["HF_TOKEN"] == "hf_planted"
    assert "HF_TOKEN" not in LocalRuntime().env(bench, ctx)


@pytest.mark.parametrize(
    "folder", ["/", "/usr", "/usr/lib/python3", "/etc", "/root", "/home", "/var", "/tmp"]
)
def test_hand_over_refuses_a_system_folder(folder):
    with pytest.raises(UserError) as caught:
        hand_over(Path(folder), (4321, 4321))
    assert caught.value.field == "writable mount" and caught.value.fix


def test_the_slurm_dry_run_shows_the_fetch_job_with_its_argv_and_credential_names(monkeypatch, tmp_path):
    from draftscope.pipeline import runner
    from draftscope.pipeline.batch import submit

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the snapshot is missing: fetch runs
    resolved = load_pipeline_config(preset="qwen3-8b", overrides={"slurm": {"partition": "gpu"}})
    plan = planning.build(resolved, registry.select("all"), tmp_path / "w", "docker")
    assert runner.fetch_step(plan) is not None
    lines = submit.dry_run_lines(plan, ContainerRuntime("docker"))
    at = lines.index(
        "# the only step given credentials, by name (values never recorded): HF_TOKEN, HUGGING_FACE_HUB_TOKEN"
    )
    fetch = shlex.split(lines[at + 2].removeprefix("#").strip())
    assert fetch[:2] == ["docker", "run"] and "--read-only" in fetch and "--network" not in fetch
    assert any(line.startswith("fetch=$(sbatch ") for line in lines)
    # With the snapshot in the cache no fetch job is submitted, and the dry run says why.
    monkeypatch.setattr(planning, "fetch_needed", lambda plan: False)
    lines = submit.dry_run_lines(plan, ContainerRuntime("docker"))
    assert "# fetch: skipped (the pinned target snapshot is in the hub cache)" in lines
    assert not any(line.startswith("fetch=$(sbatch ") for line in lines)
