"""The real stages keep the contract the toy stage proves: each declares a known image and the in-container commands
its argv runs, and the registry is the one list the plan, the runner and `python -m draftscope.pipeline` read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftscope.core import images
from draftscope.core.errors import UserError
from draftscope.core.schema import get_schema
from draftscope.pipeline import __main__ as entry_point
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config

KIT = ["python", "-m", "draftscope.pipeline"]


def test_every_stage_is_a_subpackage_that_declares_it():
    for stage in registry.STAGES:
        module = __import__(f"draftscope.pipeline.stages.{stage.name}", fromlist=["STAGE"])
        assert module.STAGE is stage
        assert stage.image in images.IMAGES, stage.name


def test_entry_names_are_unique_and_all_reach_the_entry_point():
    names = [e.name for s in registry.STAGES for e in s.entries]
    assert len(names) == len(set(names)) and "exec" not in names
    commands = entry_point.parser()._subparsers._group_actions[0].choices  # argparse keeps them here
    assert sorted(commands) == sorted(["exec", *names])


def test_the_schemas_leave_stage_names_to_the_registry():
    """Records, result files, time limits and Slurm overrides are keyed by stage name; the schemas admit any such
    name, so that a new stage is registered in one place (pipeline/registry.py), and planning refuses a name the
    registry does not know (`check_stage_names`)."""
    assert "enum" not in get_schema("stage-record")["properties"]["stage"]
    config = get_schema("pipeline-config")["properties"]
    for keyed in (config["time_limits"], config["slurm"]["properties"]["stages"]):
        (pattern,) = keyed["patternProperties"]
        assert all(re.fullmatch(pattern, name) for name in registry.NAMES)


@pytest.mark.parametrize("field", ["time_limits", "slurm.stages"])
def test_an_option_for_an_unknown_stage_is_refused_naming_the_field(field):
    opts = [f"{field}.trian=60"] if field == "time_limits" else ["slurm.stages.trian.partition=gpu"]
    resolved = load_pipeline_config(draft="dflash", preset="tiny", opts=opts)
    with pytest.raises(UserError) as err:
        planning.check_stage_names(resolved.config)
    assert err.value.field == f"{field}.trian" and "unknown stage 'trian'" in err.value.message
    assert "did you mean 'train'?" in err.value.render()


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize(("preset", "runtime"), [("qwen38-27b", "docker"), ("tiny", "local")])
def test_every_stage_argv_runs_one_of_its_own_entries_or_exec(preset, runtime, draft):
    resolved = load_pipeline_config(preset=preset, draft=draft)
    plan = planning.build(resolved, registry.STAGES, Path("/tmp/w"), runtime)
    parser = entry_point.parser()
    for sp in plan.stages:
        argv = list(sp.step.argv)
        assert argv[:3] == KIT, sp.stage.name
        own = {e.name for e in sp.stage.entries}
        if argv[3] == "exec":
            assert parser.parse_args(argv[3:]).stage == sp.stage.name
        else:
            assert argv[3] in own, (sp.stage.name, argv[3])
            assert parser.parse_args(argv[3:]).result.endswith(f"stages/{sp.stage.name}.result.json")
        for command in sp.commands:  # a server the stage starts through the kit is one of its entries too
            if command.argv[:3] == tuple(KIT):
                assert command.argv[3] in own, (sp.stage.name, command.argv)
