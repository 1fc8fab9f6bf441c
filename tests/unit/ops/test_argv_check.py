"""The host half of `python -m draftscope argv-check`: which commands the plans emit for each image, which parser
reads each, and the `--commands` file (data from a host: a bad one is a UserError, never a traceback). The engine
half runs in the real images (tests/container/test_gpu_images.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope.core.errors import UserError
from draftscope.ops import argv_check as A
from draftscope.pipeline import registry


@pytest.mark.parametrize("image", A.CHECKED_IMAGES)
def test_every_planned_command_has_a_parser(image):
    planned = A.planned(image)
    kinds = {"vllm-engine-args" if p.engine_kwargs is not None else A.classify(p.argv)[0] for p in planned}
    expected = {
        "vllm": {"vllm-serve", "vllm-engine-args", "kit-pipeline"},
        "train": {"vllm-serve", "speculators-train", "speculators-cli", "kit-pipeline"},
        "sglang": {"sglang-server", "kit-pipeline"},
        "sglang-cpu": {"sglang-server", "kit-pipeline"},
    }[image]
    assert kinds == expected
    assert len({p.where for p in planned}) == len(planned)  # every command is named once


def test_each_stage_of_an_image_is_in_its_plan():
    for image in A.CHECKED_IMAGES:
        stages = {
            p.where.split(": ", 1)[1].split()[0] for p in A.planned(image) if p.where.startswith("pipeline")
        }
        assert stages == {s.name for s in registry.STAGES if image in (s.image, s.cpu_image)}, image


def test_the_cpu_path_and_every_draft_type_are_planned():
    wheres = [p.where for p in A.planned("train")]
    for draft in ("dflash", "dspark", "dflash2"):
        assert any(f"tiny {draft} device=cpu: train" in w for w in wheres), draft
        assert any(f"qwen3-8b {draft}: train" in w for w in wheres), draft


@pytest.mark.parametrize(
    ("argv", "kind", "args"),
    [
        (["vllm", "serve", "M", "--port", "1"], "vllm-serve", ["M", "--port", "1"]),
        (["python", "-m", "vllm.entrypoints.cli.main", "serve", "M"], "vllm-serve", ["M"]),
        (
            ["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "speculators.train", "--x"],
            "speculators-train",
            ["--x"],
        ),
        (
            ["python", "-m", "speculators", "prepare-data", "--data", "d"],
            "speculators-cli",
            ["prepare-data", "--data", "d"],
        ),
        (["python", "-m", "sglang.launch_server", "--tp-size", "1"], "sglang-server", ["--tp-size", "1"]),
        (
            [
                "python",
                "-m",
                "draftscope.pipeline",
                "exec",
                "--result",
                "r",
                "s",
                "--",
                "python",
                "-m",
                "speculators",
                "x",
            ],
            "speculators-cli",
            ["x"],
        ),
        (
            ["python", "-m", "draftscope.pipeline", "regen", "--result", "r"],
            "kit-pipeline",
            ["regen", "--result", "r"],
        ),
    ],
)
def test_classify(argv, kind, args):
    assert A.classify(argv) == (kind, args)


@pytest.mark.parametrize(
    "argv", [["bash", "-c", "x"], ["python", "-m", "somewhere"], ["python"], ["vllm", "bench"]]
)
def test_a_command_no_parser_knows_is_refused_by_name(argv):
    with pytest.raises(UserError) as info:
        A.classify(argv)
    assert info.value.field == "argv" and "classify" in info.value.render()


def test_images_without_engine_commands_are_refused():
    for image in ("transformers", "vllm-cpu"):
        with pytest.raises(UserError, match="runs no engine command line"):
            A.planned(image)
    with pytest.raises(UserError, match="no image named 'nope'"):
        A.planned("nope")


def test_the_commands_file_round_trips():
    planned = A.planned("vllm")
    back = A.from_json(json.loads(json.dumps(A.to_json(planned))), "--commands")
    assert [(p.where, p.argv, p.engine_kwargs) for p in back] == [
        (p.where, p.argv, p.engine_kwargs) for p in planned
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(["where", "argv", "engine_kwargs", "x"]), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_commands_file_is_read_or_refused_with_a_user_error(data):
    try:
        out = A.from_json(data, "--commands")
    except UserError as exc:
        assert exc.render().startswith("--commands") or "--commands" in exc.render()
        return
    for item in out:  # what is accepted is exactly the documented shape
        assert isinstance(item.where, str)
        assert (item.engine_kwargs is None and item.argv and all(isinstance(a, str) for a in item.argv)) or (
            isinstance(item.engine_kwargs, dict) and item.argv == ()
        )
