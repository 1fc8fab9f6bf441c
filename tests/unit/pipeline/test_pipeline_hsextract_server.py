"""hsextract's vLLM servers: the kit's own `vllm serve` argv with the extraction configuration speculators'
launcher builds (the `extract_hidden_states` method, the layers plus the final one, the hidden-states connector
writing to the instance's scratch folder), and every other flag the stage passes. The names are checked against
the pinned vLLM wheel in tests/contract/test_hsextract_vllm_launch.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftscope.core.presets import load_model_preset, model_preset_names
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.base import Command, captured_layer_ids, speculators_layer_ids
from draftscope.pipeline.config import load_pipeline_config
from draftscope.pipeline.stages import hsextract
from draftscope.runtime import get_runtime

REAL = [p for p in model_preset_names() if load_model_preset(p).source == "hub"]


def context(preset, opts=()):
    resolved = load_pipeline_config(preset=preset, opts=list(opts))
    return planning.build(resolved, registry.select("hsextract"), Path("/tmp/w"), "docker").context


def options(argv):
    """flag → its values, for the flags after `serve MODEL`."""
    out: dict[str, list[str]] = {}
    for item in argv[5:]:
        if item.startswith("--"):
            out[item] = []
            last = item
        else:
            out[last].append(item)
    return out


def configs(argv):
    found = options(argv)
    return json.loads(found["--speculative-config"][0]), json.loads(found["--kv-transfer-config"][0])


# --- the two JSON values -------------------------------------------------------------------------------------


def test_speculative_config_captures_the_layers_and_appends_the_final_one():
    ids = [3, 19, 34]
    assert hsextract.speculative_config(ids, 36) == {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [3, 19, 34, 36]}},
    }
    assert ids == [3, 19, 34]  # the caller's list is not changed


def test_speculative_config_does_not_repeat_a_final_layer_already_there():
    # speculators' launcher appends the final index only when it is missing
    spec = hsextract.speculative_config((2, 36), 36)
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 36]


def test_kv_transfer_config_points_the_connector_at_the_scratch_folder():
    assert hsextract.kv_transfer_config("/run/hsextract/scratch-0") == {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/run/hsextract/scratch-0"},
    }


def test_the_values_are_built_from_the_named_constants(monkeypatch):
    # the contract test checks the constants; the builders must use them, not their own spellings
    from draftscope.pipeline.stages.hsextract import vllm_args

    for name in ("EXTRACT_METHOD", "LAYER_IDS_KEY", "CONNECTOR", "KV_ROLE", "STORAGE_PATH_KEY"):
        assert getattr(hsextract, name) == getattr(
            vllm_args, name
        )  # the stage re-exports what it builds with
        monkeypatch.setattr(vllm_args, name, f"<{name}>")
    spec = vllm_args.speculative_config([1], 2)
    transfer = vllm_args.kv_transfer_config("/s")
    assert spec["method"] == "<EXTRACT_METHOD>"
    assert spec["draft_model_config"]["hf_config"] == {"<LAYER_IDS_KEY>": [1, 2]}
    assert transfer == {
        "kv_connector": "<CONNECTOR>",
        "kv_role": "<KV_ROLE>",
        "kv_connector_extra_config": {"<STORAGE_PATH_KEY>": "/s"},
    }


# --- the server's argv --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", REAL)
def test_the_server_is_vllm_serve_with_the_extraction_configs(preset):
    ctx = context(preset)
    model = load_model_preset(preset)
    for inst in hsextract.instances(ctx):
        command = hsextract.server_command(ctx, inst)
        argv = list(command.argv)
        assert argv[:5] == ["python", "-m", "vllm.entrypoints.cli.main", "serve", ctx.layout.model]
        assert "--" not in argv and not any(
            a.startswith("--hidden-states") or a == "--target-layer-ids" for a in argv
        )
        speculative, transfer = configs(argv)
        assert speculative == hsextract.speculative_config(
            speculators_layer_ids(model), model.architecture.num_layers
        )
        # the layers the servers capture are the ones the stage checks and training reads (the final one last)
        assert speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == (
            captured_layer_ids(model)
        )
        assert transfer == hsextract.kv_transfer_config(ctx.layout.at("hsextract", f"scratch-{inst.index}"))
        assert command.port == inst.port and command.gpus == inst.gpus and command.env == inst.env()


@pytest.mark.parametrize("preset", REAL)
def test_the_server_keeps_every_engine_flag(preset):
    ctx = context(preset, ["hsextract.gpu_memory_utilization=0.8", "hsextract.max_model_len=4096", "seed=7"])
    model = load_model_preset(preset)
    for inst in hsextract.instances(ctx):
        found = options(list(hsextract.server_command(ctx, inst).argv))
        expected = {
            "--host": ["127.0.0.1"],
            "--port": [str(inst.port)],
            "--tensor-parallel-size": [str(inst.tp)],
            "--max-model-len": ["4096"],
            "--gpu-memory-utilization": ["0.8"],
            "--no-enable-prefix-caching": [],  # every token's hidden states computed, none from the cache
            "--seed": ["7"],
        }
        if model.architecture.is_hybrid:  # docs/develop/integration-bugs.md, bug 1
            expected |= {"--disable-custom-all-reduce": [], "--distributed-executor-backend": ["mp"]}
        assert {
            k: v for k, v in found.items() if k not in ("--speculative-config", "--kv-transfer-config")
        } == (expected)


def test_a_slurm_task_gets_its_own_scratch_folder():
    ctx = context("qwen3-8b")
    (inst, *_) = hsextract.instances(ctx)
    _, transfer = configs(list(hsextract.server_command(ctx, inst, scratch="/elsewhere/scratch-0").argv))
    assert transfer["kv_connector_extra_config"] == {"shared_storage_path": "/elsewhere/scratch-0"}


def test_the_dry_run_shows_the_server_command():
    resolved = load_pipeline_config(preset="qwen3-8b")
    plan = planning.build(resolved, registry.select("hsextract"), Path("/tmp/w"), "docker")
    text = "\n".join(planning.dry_run_lines(plan, get_runtime("docker")))
    (server,) = [line for line in text.splitlines() if line.lstrip("# ").startswith("server-0:")]
    assert "python -m vllm.entrypoints.cli.main serve " in server
    assert '--speculative-config \'{"method": "extract_hidden_states"' in server
    assert '"shared_storage_path": "/draftscope/run/hsextract/scratch-0"' in server
    assert "launch_vllm" not in text


# --- the final layer: the preset's layer count against the served model's own config (runner, before any server) -


def _server(model: Path, layers: list[int]) -> Command:
    spec = json.dumps(
        {
            "method": "extract_hidden_states",
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}},
        }
    )
    argv = (
        "python",
        "-m",
        hsextract.VLLM_CLI,
        "serve",
        str(model),
        "--speculative-config",
        spec,
        "--port",
        "8200",
    )
    return Command("server-0", argv, port=8200)


@pytest.mark.parametrize(
    ("config", "agrees"),
    [
        ({"num_hidden_layers": 36}, True),
        ({"num_hidden_layers": 35}, False),
        (
            {"text_config": {"num_hidden_layers": 36}, "num_hidden_layers": 4},
            True,
        ),  # multimodal: the text model's
        ({}, False),
    ],
)
def test_the_final_captured_layer_is_the_models_layer_count(tmp_path, config, agrees):
    from draftscope.core.errors import UserError
    from draftscope.pipeline.stages.hsextract import runner

    (tmp_path / "config.json").write_text(json.dumps(config))
    commands = [_server(tmp_path, [3, 19, 34, 36])]
    if agrees:
        runner.check_final_layer(commands)
        return
    with pytest.raises(UserError) as info:
        runner.check_final_layer(commands)
    assert info.value.field == "architecture.num_layers" and info.value.value == 36
    assert "num_hidden_layers" in info.value.render() and str(tmp_path) in info.value.render()


def test_a_server_that_extracts_nothing_is_not_checked(tmp_path):
    from draftscope.pipeline.stages.hsextract import runner

    runner.check_final_layer([Command("server-0", ("python", "-c", "pass"), port=1)])  # no model config read


def test_every_planned_extraction_server_names_its_final_layer():
    """Each hub preset's planned server captures its preset's layer count last: what the runner checks."""
    from draftscope.core.presets import load_model_preset, model_preset_names
    from draftscope.ops import argv_check
    from draftscope.pipeline.stages.hsextract.vllm_args import captured_layers

    for planned in argv_check.planned("train"):
        layers = captured_layers(planned.argv) if planned.argv else None
        if layers is None:
            continue
        preset = planned.where.split()[1]
        assert preset in model_preset_names()
        assert layers[-1] == load_model_preset(preset).architecture.num_layers, planned.where
