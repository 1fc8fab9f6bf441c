"""Bind mounts as `--mount type=bind,source=…,target=…[,readonly]`: any host path survives the engine's CSV parse.

docker and podman read the value as one CSV record (Go's encoding/csv, default settings), then split each field at
its first `=`; Python's csv reader with its defaults reads the same quoting (a field quoted whole, quotes doubled).
"""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope.core.errors import UserError
from draftscope.runtime.base import Context
from draftscope.runtime.container import ContainerRuntime, mount_spec
from draftscope.runtime.step import RUN_MOUNT, Mount, Step


def parse(spec: str) -> dict[str, str]:
    (row,) = list(csv.reader([spec]))
    fields = {}
    for item in row:
        key, eq, value = item.partition("=")
        fields[key] = value if eq else True
    return fields


# Any text but the characters no engine can carry in a path (refused, below).
PATHS = st.text(st.characters(blacklist_characters="\n\r\0", blacklist_categories=("Cs",)), min_size=1).map(
    lambda s: "/" + s.lstrip("/")
)


@settings(max_examples=300, deadline=None)
@given(source=PATHS, target=PATHS, read_only=st.booleans())
def test_the_mount_field_parses_back_to_exactly_the_paths(source, target, read_only):
    fields = parse(mount_spec(source, target, read_only))
    assert fields["type"] == "bind"
    assert fields["source"] == source and fields["target"] == target
    assert fields.get("readonly", False) is read_only
    assert len(fields) == 3 + read_only


@pytest.mark.parametrize(
    "source, expected",
    [
        ("/data/a:b", "type=bind,source=/data/a:b,target=/t"),  # `--volume` would have split this one
        ("/data/a,b", '"source=/data/a,b"'),
        ('/data/say "hi"', '"source=/data/say ""hi"""'),
        ("/data/with space", "source=/data/with space"),
    ],
)
def test_the_quoting_the_engines_read(source, expected):
    assert expected in mount_spec(source, "/t", False)


@pytest.mark.parametrize("bad", ["/a\nb", "/a\rb", "/a\0b"])
def test_a_path_no_engine_can_carry_is_refused(bad):
    with pytest.raises(UserError, match="newline or NUL") as err:
        mount_spec(bad, "/t", True)
    assert "fix:" in err.value.render()


def test_the_run_argv_has_one_mount_per_step_mount_and_no_volume(tmp_path):
    run_dir = tmp_path / 'out:put, "x"' / "R1"
    step = Step(
        name="benchmark",
        image="transformers",
        argv=("python", "-c", "pass"),
        mounts=(Mount("ignored", RUN_MOUNT, read_only=False), Mount(str(tmp_path / "c:a,c"), "/cache")),
    )
    argv = ContainerRuntime("docker").argv(step, Context(run_dir=run_dir, run_id="R1"))
    assert "--volume" not in argv
    specs = [parse(argv[i + 1]) for i, word in enumerate(argv) if word == "--mount"]
    assert specs == [
        {"type": "bind", "source": str(run_dir), "target": RUN_MOUNT},
        {"type": "bind", "source": str(tmp_path / "c:a,c"), "target": "/cache", "readonly": True},
    ]
