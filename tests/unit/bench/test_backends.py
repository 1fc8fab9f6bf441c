"""The backend registry and its specs: what the rest of the kit learns about a backend, from the backend alone.

A toy backend registered into a copy of the registry shows that planning, the dry run and `invoke plan` take
every backend fact (image, `--ipc host`, checks, notes, dry-run lines) from the spec, with no name tested."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from draftscope.bench import backends
from draftscope.bench.backends import Backend
from draftscope.bench.plan import plan_benchmark
from draftscope.core import images, platforms
from draftscope.core import presets as P
from draftscope.core.errors import UserError
from draftscope.core.resources import repo_root
from draftscope.runtime import Outcome, get_runtime

SHA = "0123456789abcdef0123456789abcdef01234567"
NAMES = list(backends.BACKENDS)


# --- the registry -------------------------------------------------------------------------------------------


def test_the_registry_is_keyed_by_each_specs_own_name():
    assert NAMES == ["transformers", "vllm"]
    for name, spec in backends.BACKENDS.items():
        assert isinstance(spec, Backend) and spec.name == name
        assert backends.get(name) is spec


def test_an_unknown_backend_is_an_error_listing_the_valid_ones():
    with pytest.raises(UserError) as err:
        backends.get("sglang")
    assert err.value.field == "--backend"
    assert err.value.fix == "choose one of: transformers, vllm"
    assert "unknown backend 'sglang'" in str(err.value) and "\n" not in str(err.value)


def test_the_registry_alone_names_the_backends():
    # The schema admits any backend name and ExperimentConfig types it as text: a new backend is registered in one
    # place (BACKENDS), and planning refuses a name the registry does not know.
    schema = json.loads((repo_root() / "schemas" / "experiment.schema.json").read_text(encoding="utf-8"))
    assert "enum" not in schema["properties"]["backend"]
    assert all(re.fullmatch(schema["properties"]["backend"]["pattern"], name) for name in NAMES)
    assert typing.get_type_hints(P.ExperimentConfig)["backend"] is str
    config = P.load_experiment("transformers-baseline", {"backend": "tgi"})
    with pytest.raises(UserError, match="unknown backend 'tgi'"):
        plan_benchmark(config)


def test_the_specs_import_neither_torch_nor_vllm_nor_transformers():
    code = (
        "import sys; from draftscope.bench import backends; "
        "[spec.engine_class() for spec in backends.BACKENDS.values()]; "
        "heavy = [n for n in ('torch', 'vllm', 'transformers') if n in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_backend_is_told_apart_by_its_name_outside_the_backends():
    package = Path(backends.__file__).parents[2]  # src/draftscope
    tests = re.compile(r'backend ?[!=]= ?"')
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package).parts[:2] != ("bench", "backends")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if tests.search(line)
    ]
    assert not found, f"read the backend's spec (bench/backends/<name>/) instead: {found}"


# --- each spec's facts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_each_spec_names_a_kit_image_and_its_engine(name):
    spec = backends.get(name)
    assert spec.image in images.IMAGES
    engine = spec.engine_class()
    assert engine.name == name and all(callable(getattr(engine, m)) for m in ("load", "encode", "generate"))


@pytest.mark.parametrize("name", NAMES)
def test_linux_only_agrees_with_the_platform_rules(name):
    spec = backends.get(name)
    assert spec.linux_only == (platforms.refusal(name, "darwin") is not None)
    assert platforms.refusal(name, "linux") is None


def test_transformers_runs_on_the_gpu_or_the_cpu_anywhere():
    spec = backends.get("transformers")
    assert spec.image == "transformers"
    assert spec.devices == ("cuda", "cpu") and not spec.needs_cuda
    assert not (spec.linux_only or spec.ipc_host or spec.gpu_facts_via_nvml)
    assert spec.oom_markers == ()
    config = P.load_experiment("transformers-baseline")
    preset = P.load_model_preset(config.model_preset)
    assert spec.gpus_per_task(config) == 1
    assert spec.draft_detail(preset) == "" and list(spec.dry_run_lines(config, preset)) == []


def test_vllm_runs_on_linux_with_shared_memory_on_the_gpu_or_its_cpu_engine():
    spec = backends.get("vllm")
    assert spec.image == "vllm" and spec.image_for("cuda") == "vllm" and spec.image_for("cpu") == "vllm-cpu"
    assert spec.experiment_for(None) == spec.experiment_for("cuda") == "vllm-int4-dflash2"
    assert spec.experiment_for("cpu") == "vllm-tiny-cpu"
    assert spec.devices == ("cuda", "cpu") and not spec.needs_cuda
    assert spec.linux_only and spec.ipc_host and spec.gpu_facts_via_nvml
    assert "No available memory for the cache blocks" in spec.oom_markers


def test_vllm_gpus_notes_and_dry_run_lines_come_from_the_config():
    spec = backends.get("vllm")
    config = P.load_experiment("vllm-int4-dflash2", opts=["vllm.tensor_parallel_size=2"])
    preset = P.load_model_preset(config.model_preset)  # hybrid, block size 8
    assert spec.gpus_per_task(config) == 2
    assert spec.draft_detail(preset) == " (num_speculative_tokens 7)"
    assert [n for n in spec.notes(config, preset) if n.startswith("hybrid (linear-attention) target")]
    assert spec.notes(config, P.load_model_preset("qwen3-8b")) == ()
    comment, args = spec.dry_run_lines(config, preset)
    assert comment.startswith("# vLLM engine arguments the worker passes")
    assert json.loads(args.removeprefix("# "))["tensor_parallel_size"] == 2


# --- the backends' config rules, checked when a benchmark is planned ----------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"head": {"policy": "rowwise"}}, "head.policy", "add --backend transformers --draft …"),
        ({"int4_dflash": True}, "int4_dflash", "add --backend vllm or drop --int4-dflash"),
        ({"experimental_prefix": True}, "experimental_prefix", "add --backend vllm --int4-dflash"),
    ],
)
def test_transformers_refuses_what_only_another_loop_runs(overrides, field, fix):
    config = P.load_experiment("transformers-baseline", overrides)
    with pytest.raises(UserError) as err:
        backends.get("transformers").check(config)
    assert err.value.field == field and err.value.fix.startswith(fix)


def test_transformers_runs_the_certified_head_with_a_draft():
    config = P.load_experiment("tiny-cpu", {"draft": "tiny", "head": {"policy": "rowwise"}})
    backends.get("transformers").check(config)


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        ({"head": {"shadow": True}}, "head.policy", "dense"),
        ({"int4_dflash": False, "experimental_prefix": True}, "experimental_prefix", True),
        ({"device": "cpu"}, "model_preset", "qwen38-27b"),  # the CPU engine runs the tiny models only
        ({"device": "cpu", "model_preset": "tiny"}, "int4_dflash", True),
        ({"model_preset": "tiny", "int4_dflash": False}, "device", "cuda"),  # tiny: the CPU engine only
        (
            {
                "device": "cpu",
                "model_preset": "tiny",
                "int4_dflash": False,
                "draft": "o/d",
                "draft_revision": "a" * 40,
            },
            "draft",
            "o/d",
        ),
    ],
)
def test_vllm_refusals_name_the_field_and_the_value(overrides, field, value):
    config = P.load_experiment("vllm-int4-dflash2", overrides)
    with pytest.raises(UserError) as err:
        backends.get("vllm").check(config)
    assert (err.value.field, err.value.value) == (field, value)


@pytest.mark.parametrize("name", P.experiment_preset_names())
def test_every_experiment_preset_passes_its_backends_rules(name):
    config = P.load_experiment(name)
    backends.get(config.backend).check(config)


# --- a backend the kit has never heard of, registered into a copy of the registry ---------------------------


def _refuse_cpu(config: P.ExperimentConfig) -> None:
    if config.device == "cpu":
        raise UserError("the toy backend refuses the CPU", field="device", value=config.device)


TOY = Backend(
    name="toy",
    image="sglang",
    engine="draftscope.bench.backends.transformers.backend:TransformersBackend",
    devices=("cuda",),
    default_experiment="transformers-baseline",
    ipc_host=True,
    oom_markers=("toy ran out",),
    check=_refuse_cpu,
    notes=lambda config, preset: (f"toy note for {preset.name}",),
    dry_run_lines=lambda config, preset: ("# toy engine line",),
    draft_detail=lambda preset: " (toy draft)",
    gpus_per_task=lambda config: 3,
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(backends, "BACKENDS", {**backends.BACKENDS, "toy": TOY})
    # ExperimentConfig's type admits only the real backends; `replace` builds the frozen config as a run would.
    config = P.load_experiment("tiny-cpu", {"draft": "Org/Draft", "draft_revision": SHA})
    return dataclasses.replace(config, backend="toy", device="cuda")


def test_a_toy_backend_flows_through_planning_to_its_step(toy):
    plan = plan_benchmark(toy)
    step = plan.steps[-1]
    assert plan.backend is TOY
    assert (step.name, step.image, step.ipc_host, step.gpus) == ("benchmark", "sglang", True, -1)
    assert "toy note for tiny" in plan.notes


def test_a_toy_backends_rules_are_checked_when_planned(toy):
    with pytest.raises(UserError, match="the toy backend refuses the CPU"):
        plan_benchmark(dataclasses.replace(toy, device="cpu"))


def test_a_toy_backends_dry_run_plan_and_slurm_pieces(toy, tmp_path):
    from draftscope.bench.batch import gpus_used
    from draftscope.bench.supervisor import dry_run_lines
    from draftscope.cli.render import plan_lines

    plan = plan_benchmark(toy)
    assert dry_run_lines(plan, get_runtime("docker"), tmp_path / "run")[-1] == "# toy engine line"
    lines = plan_lines(plan, lambda name: f"ref-of-{name}")
    assert "  image: ref-of-sglang" in lines and f"  draft: Org/Draft@{SHA} (toy draft)" in lines
    assert gpus_used(plan) == 3


def test_a_toy_backends_out_of_memory_words_name_the_failure(toy, tmp_path):
    from draftscope.bench.supervisor import _reason

    plan = plan_benchmark(toy)
    log = tmp_path / "benchmark.log"
    log.write_text("loading\ntoy ran out\n", encoding="utf-8")
    outcome = Outcome("benchmark", "failed", 1, 2.0, "exit code 1", log)
    assert _reason(plan, outcome) == "out of memory (step 'benchmark', exit code 1); see benchmark.log"
    log.write_text("loading\n", encoding="utf-8")
    assert _reason(plan, outcome) == "exit code 1"


def test_a_linux_only_backend_is_refused_elsewhere_before_the_run(monkeypatch):
    from draftscope.bench.supervisor import preflight

    plan = plan_benchmark(P.load_experiment("vllm-int4-dflash2"))
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(UserError, match="vLLM runs on Linux hosts only") as err:
        preflight(plan, get_runtime("docker"), here=False)
    assert err.value.field == "--backend"
