"""The stage contract, proven with a stage that exists only here: a declaration (name, image, summary, inputs,
outputs, argv builder, in-container entry) plus one registry entry is what the plan, the dry run, the runner and
`python -m draftscope.pipeline` need. Registered by monkeypatching `registry.STAGES`, the toy is planned, printed by
`invoke pipeline --dry-run` with its own image and argv, dispatched by the entry point, and refused or checked by the
runner from what it declares. No container, no torch. (A real stage also adds its name to the schemas that key
records by stage: test_registry.py.)"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from invoke import Collection, Program

from draftscope.cli.pipeline import PIPELINE_TASKS
from draftscope.core import images
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.pipeline import __main__ as entry_point
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry, runner
from draftscope.pipeline.base import Artifact, Entry, Stage, StageContext, kit_argv
from draftscope.pipeline.config import load_pipeline_config

NAME = "toy"
IMAGE = "transformers"  # no real stage runs here: the plan can only have taken it from the declaration
SUMMARY = "counts the benchmark prompts (a stage that exists only in this test)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True)
    p.add_argument("--output", required=True)


def count_prompts(args: argparse.Namespace) -> dict[str, Any]:
    count = len(json.loads(Path(args.prompts).read_text(encoding="utf-8"))["prompts"])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({"prompts": count}), encoding="utf-8")
    return {"prompts": count}


def argv(ctx: StageContext) -> list[str]:
    return kit_argv(
        ctx, NAME, NAME, ["--prompts", ctx.layout.prompts, "--output", ctx.layout.at("toy", "n.json")]
    )


TOY = Stage(
    name=NAME,
    image=IMAGE,
    summary=SUMMARY,
    uses_gpu=False,
    output_schema=None,
    inputs=lambda ctx: [Artifact("prompts", ctx.inputs["prompts"])],
    outputs=lambda ctx: [Artifact("count", ctx.host("toy", "n.json"))],
    argv=argv,
    notes=lambda ctx: ["a note the toy declares"],
    entries=(Entry(NAME, "count the prompts", add_arguments, count_prompts),),
)


@pytest.fixture
def toy(monkeypatch):
    """The toy registered after the real stages: the one line a new stage adds to `registry.STAGES`."""
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES, TOY))
    return TOY


def invoke_pipeline(*args: str) -> None:
    """`invoke pipeline ARGS` in this process (so the monkeypatched registry is the one it reads)."""
    Program(namespace=Collection(*PIPELINE_TASKS), binary="invoke").run(
        ["invoke", "pipeline", *args], exit=False
    )


def plan_of(
    stage: str = NAME, *, preset: str = "qwen38-27b", runtime: str = "docker", workdir: Path = Path("/w")
):
    resolved = load_pipeline_config(preset=preset)
    return planning.build(resolved, registry.select(stage), workdir, runtime)


def test_the_dry_run_prints_the_toy_with_its_image_and_argv(toy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    invoke_pipeline("--stage", NAME, "--dry-run", "--workdir", str(tmp_path / "w"))
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert f"# [1/1] {NAME}: {SUMMARY}" in lines
    assert f"#   image {IMAGE}: {images.image_reference(IMAGE)}" in lines
    stage = lines[lines.index(f"# [1/1] {NAME}: {SUMMARY}") :]  # the fetch step comes before it
    (container,) = [
        line for line in stage if not line.startswith("#") and images.image_reference(IMAGE) in line
    ]
    command = shlex.split(container)
    tail = command[command.index(images.image_reference(IMAGE)) + 1 :]
    assert tail == [
        "python",
        "-m",
        "draftscope.pipeline",
        NAME,
        "--result",
        "/draftscope/run/stages/toy.result.json",
        "--prompts",
        "/draftscope/inputs/prompts.json",
        "--output",
        "/draftscope/run/toy/n.json",
    ]
    assert "#   note: a note the toy declares" in lines
    assert list(tmp_path.iterdir()) == []  # a dry run creates nothing


def test_all_stages_take_the_toy_last_in_registry_order(toy, capsys):
    invoke_pipeline("--stage", "all", "--dry-run")
    out = capsys.readouterr().out
    total = len(registry.STAGES)
    assert f"# [{total}/{total}] {NAME}: {SUMMARY}" in out.splitlines()
    assert [s.name for s in registry.select(f"{NAME},regen")] == ["regen", NAME]


def test_an_unknown_stage_lists_the_registered_ones_the_toy_included(toy):
    with pytest.raises(UserError, match=f"choose all or any of: regen, .*, bench, {NAME}"):
        registry.get("tyo")


def test_the_plan_takes_the_image_argv_and_outputs_from_the_declaration(toy):
    plan = plan_of()
    (sp,) = plan.stages
    assert sp.stage is TOY and sp.step.image == IMAGE and sp.step.name == NAME
    assert list(sp.step.argv) == argv(plan.context)
    assert sp.step.outputs == ("toy/n.json",) and sp.step.gpus == 0
    assert [a.name for a in sp.inputs] == ["prompts"]


def test_the_in_container_entry_point_dispatches_to_the_toy(toy, tmp_path):
    """`python -m draftscope.pipeline toy …` finds the toy's entry through the registry and runs it. (Without
    `--result`: a result file names a stage the stage-record schema lists, and the toy is not in the schemas.)"""
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"id": "a"}, {"id": "b"}]}), encoding="utf-8")
    output = tmp_path / "toy" / "n.json"
    assert entry_point.main([NAME, "--prompts", str(prompts), "--output", str(output)]) == 0
    assert read_json(output) == {"prompts": 2}
    args = entry_point.parser().parse_args(argv(plan_of().context)[3:])
    assert args.result == "/draftscope/run/stages/toy.result.json" and args.prompts.endswith("prompts.json")


def register(monkeypatch, **fields: Any) -> Stage:
    """The toy with some declared fields changed, registered in place of the plain one."""
    stage = replace(TOY, **fields)
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES, stage))
    return stage


def test_a_stage_without_a_cpu_path_says_why_and_the_runner_repeats_it(monkeypatch):
    register(monkeypatch, cpu_refusal="needs a toy accelerator")
    cpu = plan_of(preset="tiny", runtime="local")
    assert runner.not_built(cpu.stages[0], cpu.context) == f"{NAME} needs a toy accelerator"
    cuda = plan_of()
    assert runner.not_built(cuda.stages[0], cuda.context) is None


def test_the_engine_a_stage_declares_is_refused_off_linux(monkeypatch):
    register(monkeypatch, engine="sglang")
    (sp,) = plan_of().stages
    monkeypatch.setattr(sys, "platform", "darwin")
    assert runner.engine_refusal(sp, "hub").startswith("SGLang runs on Linux hosts only")
    assert runner.engine_refusal(sp, "kit") is None  # the tiny path starts no engine
    monkeypatch.setattr(sys, "platform", "linux")
    assert runner.engine_refusal(sp, "hub") is None


def test_the_runner_checks_inputs_through_the_stage(monkeypatch):
    def refuse(ctx: StageContext) -> None:
        raise UserError("not toy rows", field="data.chat")

    register(monkeypatch, check_inputs=refuse)
    with pytest.raises(UserError, match="not toy rows"):
        runner.check_inputs(plan_of())
