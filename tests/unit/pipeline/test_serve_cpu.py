"""serve and bench on a CPU: SGLang's CPU engine in the sglang-cpu image, serving the tiny preset's draft model
(STANDALONE); the converted DFlash draft and a CPU without AMX are refused in the preflight, before any stage starts,
each with its fix. The engine itself: tests/container/test_sglang_cpu_image.py (make test-sglang-cpu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry, runner, sglang_cpu
from draftscope.pipeline.config import load_pipeline_config
from draftscope.pipeline.sglang import argv_value
from draftscope.pipeline.stages import serve
from draftscope.runtime import get_runtime

XEON = "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx512f amx_bf16 amx_tile amx_int8\n"
EPYC = "model name\t: AMD EPYC 9B14\nflags\t\t: avx512f avx512_bf16\n"


def build(opts=(), preset="tiny", stage="serve,bench", runtime="docker", workdir="/tmp/w"):
    resolved = load_pipeline_config(draft="dflash", preset=preset, opts=opts)
    return planning.build(resolved, registry.select(stage), Path(workdir), runtime)


def stage_plan(plan, name):
    (found,) = [sp for sp in plan.stages if sp.stage.name == name]
    return found


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    def use(text: str) -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(sglang_cpu, "CPUINFO", path)

    return use


def test_the_cpu_path_serves_the_draft_model_on_sglangs_cpu_engine():
    plan = build(["serve.draft=model", "serve.draft_steps=3"])
    assert plan.context.cpu
    for name in ("serve", "bench"):
        sp = stage_plan(plan, name)
        assert sp.step.image == "sglang-cpu" and sp.step.gpus == 0
    (command,) = stage_plan(plan, "serve").stage.commands(plan.context)
    argv = list(command.argv)
    assert argv_value(argv, "--device") == "cpu"
    assert dict(command.env) == {"SGLANG_USE_CPU_ENGINE": "1"}
    assert argv_value(argv, "--speculative-algorithm") == "STANDALONE"
    assert argv_value(argv, "--speculative-num-steps") == "3"
    assert argv_value(argv, "--speculative-num-draft-tokens") == "4"
    # The kit's tiny draft model beside the target, and the tokenizer folder they share.
    layout = plan.context.layout
    assert argv_value(argv, "--model-path") == layout.model
    assert argv_value(argv, "--tokenizer-path") == layout.tokenizer
    assert argv_value(argv, "--speculative-draft-model-path") == f"{layout.tokenizer}/draft"
    assert "--tp-size" not in argv and "--mem-fraction-static" not in argv
    bench = list(stage_plan(plan, "bench").step.argv)
    assert argv_value(bench, "--draft") == "model" and argv_value(bench, "--algorithm") == "STANDALONE"
    assert argv_value(bench, "--draft-tokens") == "4"
    notes = stage_plan(plan, "serve").stage.notes(plan.context)
    assert "SGLang instance on its CPU engine (image sglang-cpu" in notes[0]


def test_the_converted_dflash_draft_is_refused_quoting_sglang(cpuinfo):
    cpuinfo(XEON)
    plan = build()
    with pytest.raises(UserError) as raised:
        runner.preflight(plan, get_runtime("local"), check_gpus=False)
    text = raised.value.render()
    assert sglang_cpu.DFLASH_REFUSAL in text and "serve.draft" in text
    assert "--opts serve.draft=model" in text


def test_a_cpu_without_amx_is_refused_before_any_stage(cpuinfo):
    cpuinfo(EPYC)
    plan = build(["serve.draft=model"])
    with pytest.raises(UserError) as raised:
        runner.preflight(plan, get_runtime("local"), check_gpus=False)
    text = raised.value.render()
    assert "AMD EPYC 9B14 has no amx_tile or amx_bf16" in text and "Xeon" in text


def test_the_draft_model_is_the_kit_presets_only():
    with pytest.raises(UserError, match="has no draft model to serve"):
        build(["serve.draft=model"], preset="qwen3-8b")


def test_the_gpu_path_serves_the_draft_model_too():
    plan = build(["serve.draft=model", "device=cuda"])
    if plan.context.cpu:
        pytest.skip("the tiny preset plans for a CPU here")
    (command,) = stage_plan(plan, "serve").stage.commands(plan.context)
    assert argv_value(list(command.argv), "--speculative-algorithm") == "STANDALONE"


def test_the_local_runtime_without_sglang_is_sent_to_the_image(cpuinfo, monkeypatch):
    import importlib.util

    cpuinfo(XEON)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    plan = build(["serve.draft=model"], runtime="local")
    with pytest.raises(UserError) as raised:
        runner.preflight(plan, get_runtime("local"), check_gpus=False)
    assert "--runtime docker" in raised.value.render()


def _model(folder: Path, **config) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", **config}))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_head_size_sglangs_cpu_kernel_cannot_take_is_refused(cpuinfo):
    cpuinfo(XEON)
    plan = build(["serve.draft=model"])
    with pytest.raises(UserError) as raised:
        serve.cpu_check(plan.context)
    text = raised.value.render()
    # The kit's tiny target: 192 hidden / 4 heads.
    assert "multiples of 32" in text and "the target's is 48" in text and "model_path" in text


def test_local_models_of_a_head_size_it_takes_pass(cpuinfo, tmp_path):
    cpuinfo(XEON)
    target = _model(tmp_path / "target", hidden_size=128, num_attention_heads=2)
    draft = _model(tmp_path / "draft", head_dim=32, hidden_size=64, num_attention_heads=4)
    opts = [f"model_path={target}", "serve.draft=model", f"serve.draft_model={draft}", "device=cpu"]
    plan = build(opts, preset="qwen3-8b", workdir=str(tmp_path / "w"))
    serve.cpu_check(plan.context)
    (command,) = stage_plan(plan, "serve").stage.commands(plan.context)
    assert (
        argv_value(list(command.argv), "--speculative-draft-model-path") == "/draftscope/models/draft-model"
    )
    assert any(
        m.source == str(draft) and m.target == "/draftscope/models/draft-model" for m in plan.context.mounts
    )
    bad = _model(tmp_path / "bad", hidden_size=96, num_attention_heads=2)
    plan = build([*opts[:2], f"serve.draft_model={bad}", "device=cpu"], preset="qwen3-8b")
    with pytest.raises(UserError, match="the draft model's is 48"):
        serve.cpu_check(plan.context)


def test_a_draft_model_folder_needs_serve_draft_model(tmp_path):
    draft = _model(tmp_path / "draft", hidden_size=64, num_attention_heads=2)
    with pytest.raises(UserError, match=r"only with serve\.draft=model"):
        build([f"serve.draft_model={draft}"])
