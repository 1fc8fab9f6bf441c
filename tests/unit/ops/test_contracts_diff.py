"""`invoke contracts.diff`: the kit's surface looked up in small synthetic release wheels (zip files holding a few
module sources laid out as the real releases lay them out). A renamed flag, a removed Literal value and a changed
metric name are each reported with the kit features they touch; identical releases print nothing; a bad argument
or a wheel that cannot be had is one line."""

from __future__ import annotations

import json
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftscope.bench.backends.vllm import backend as V
from draftscope.cli import ns
from draftscope.core.errors import UserError
from draftscope.ops import contracts as K
from draftscope.ops.contracts import clis, packages, surface, wheels
from draftscope.ops.contracts.diff import compare
from draftscope.ops.contracts.forms import Sources

from support import run_tasks

OTHER = "9.9.9"


def make_wheel(
    path: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()
) -> Path:
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}\nbody\n"
        )
        for file, text in files.items():
            zf.writestr(file, text)
    return path


# --- a synthetic vLLM ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_items() -> list[surface.Item]:
    return surface.vllm_items()


def used(items, how: str) -> list[tuple[str, ...]]:
    return [i.lookup for i in items if i.lookup[0] == how]


def vllm_files(
    items, *, drop_flags=(), drop_dtypes=(), counters=V.SPEC_COUNTERS, frontend_bools=()
) -> dict[str, str]:
    """vLLM's layout for the names the backend and the servers use: EngineArgs (with its dtype Literal) in
    arg_utils, re-exported by the package; the frontend's fields; the spec-decode counter names."""
    dtypes = sorted({lk[4] for lk in used(items, "literal") if lk[3] == "dtype"} | {"auto"})
    engine_fields = sorted({lk[3] for lk in used(items, "field") if lk[2] == "EngineArgs"})
    flags = sorted({lk[1] for lk in used(items, "serve-flag") if not lk[1].startswith("--no-")})
    kept = [d for d in dtypes if d not in drop_dtypes]
    engine = "from typing import Literal\n\nModelDType = Literal[" + ", ".join(map(repr, kept)) + "]\n\n"
    engine += "class EngineArgs:\n" + "".join(
        f"    {f}: {'ModelDType' if f == 'dtype' else 'object'} = None\n" for f in engine_fields
    )
    frontend = "class FrontendArgs:\n    pass\n" + "".join(
        f"    {f[2:].replace('-', '_')}: {'bool' if f in frontend_bools else 'str'} = None\n"
        for f in flags
        if f not in drop_flags
    )
    return {
        "vllm/__init__.py": "from vllm.engine.arg_utils import EngineArgs\n",
        "vllm/engine/__init__.py": "",
        "vllm/engine/arg_utils.py": engine,
        "vllm/entrypoints/common/cli_args.py": frontend,
        "vllm/v1/spec_decode/metrics.py": "NAMES = [" + ", ".join(map(repr, counters)) + "]\n",
    }


def sources(tmp: Path, name: str, files: dict[str, str], version: str = OTHER) -> Sources:
    return Sources(
        wheels.Release(make_wheel(tmp / f"{name}-{version}-py3-none-any.whl", name, version, files))
    )


def test_identical_releases_differ_in_nothing(tmp_path, vllm_items):
    a = sources(tmp_path, "vllm", vllm_files(vllm_items), version="1")
    b = sources(tmp_path, "vllm", vllm_files(vllm_items), version="2")
    changes, unresolved = compare(vllm_items, a, b)
    assert changes == []
    assert len(unresolved) < len(vllm_items)  # the synthetic release defines a part of the surface


def test_a_renamed_flag_a_removed_literal_value_and_a_changed_metric_are_each_reported(tmp_path, vllm_items):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    dtype = next(lk[4] for lk in used(vllm_items, "literal") if lk[3] == "dtype")
    renamed = (V.SPEC_COUNTERS[0] + "_total", *V.SPEC_COUNTERS[1:])
    pinned = sources(tmp_path / "a", "vllm", vllm_files(vllm_items))
    other = sources(
        tmp_path / "b",
        "vllm",
        vllm_files(vllm_items, drop_flags=("--port",), drop_dtypes=(dtype,), counters=renamed),
    )
    changes, _ = compare(vllm_items, pinned, other)
    by_name = {c.item: c for c in changes}
    assert set(by_name) == {"vllm serve --port", f"EngineArgs.dtype = {dtype!r}", V.SPEC_COUNTERS[0]}
    port = by_name["vllm serve --port"]
    assert (port.kind, port.pinned, port.other) == ("flag", "takes a value", "absent")
    assert "regen server" in port.features
    literal = by_name[f"EngineArgs.dtype = {dtype!r}"]
    assert (
        literal.kind == "literal"
        and literal.pinned == "admitted"
        and literal.other.startswith("not admitted")
    )
    assert all(f.startswith("benchmark --backend vllm") for f in literal.features)
    metric = by_name[V.SPEC_COUNTERS[0]]
    assert (metric.kind, metric.pinned, metric.other) == ("metric", "present", "absent")


def test_a_value_flag_turned_switch_is_a_change_of_form(tmp_path, vllm_items):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    pinned = sources(tmp_path / "a", "vllm", vllm_files(vllm_items))
    other = sources(tmp_path / "b", "vllm", vllm_files(vllm_items, frontend_bools=("--max-model-len",)))
    (change,) = compare(vllm_items, pinned, other)[0]
    assert (change.item, change.pinned, change.other) == (
        "vllm serve --max-model-len",
        "takes a value",
        "switch",
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_exactly_what_was_removed_is_reported(vllm_items, data):
    flags = sorted({lk[1] for lk in used(vllm_items, "serve-flag") if not lk[1].startswith("--no-")})
    dtypes = sorted({lk[4] for lk in used(vllm_items, "literal") if lk[3] == "dtype"})
    gone_flags = data.draw(st.sets(st.sampled_from(flags)))
    gone_dtypes = data.draw(st.sets(st.sampled_from(dtypes)))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "a").mkdir(), (root / "b").mkdir()
        pinned = sources(root / "a", "vllm", vllm_files(vllm_items))
        other = sources(
            root / "b", "vllm", vllm_files(vllm_items, drop_flags=gone_flags, drop_dtypes=gone_dtypes)
        )
        changes, _ = compare(vllm_items, pinned, other)
    expected = {f"vllm serve {f}" for f in gone_flags} | {f"EngineArgs.dtype = {d!r}" for d in gone_dtypes}
    assert {c.item for c in changes} == expected


# --- the whole command, from a cache of synthetic wheels -----------------------------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch, vllm_items):
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv(wheels.CACHE_ENV, str(folder))
    make_wheel(
        folder / f"vllm-{V.PINNED_VERSION}-py3-none-any.whl", "vllm", V.PINNED_VERSION, vllm_files(vllm_items)
    )
    other = vllm_files(vllm_items, drop_flags=("--port",))
    make_wheel(folder / f"vllm-{OTHER}-py3-none-any.whl", "vllm", OTHER, other)
    return folder


def test_the_pinned_release_against_itself_prints_nothing(cache):
    result = run_tasks(ns, "contracts.diff", f"vllm=={V.PINNED_VERSION}")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_table_names_the_item_its_forms_and_the_features(cache):
    result = run_tasks(ns, "contracts.diff", f"vllm=={OTHER}")
    assert result.returncode == 0, result.stderr
    for word in ("vllm serve --port", "takes a value", "absent", "regen server", V.PINNED_VERSION, OTHER):
        assert word in result.stdout
    doc = json.loads(run_tasks(ns, "contracts.diff", f"vllm=={OTHER}", "--json").stdout)
    assert (doc["package"], doc["pinned"], doc["other"]) == ("vllm", V.PINNED_VERSION, OTHER)
    assert [c["item"] for c in doc["changes"]] == ["vllm serve --port"]
    assert doc["changes"][0]["features"] and doc["items"] > 50


@pytest.mark.parametrize(
    ("argument", "words"),
    [
        ("vllm", ("expected NAME==VERSION", "'vllm'", "vllm==")),
        ("vllm==", ("expected NAME==VERSION",)),
        ("torch==2.0", ("unknown package 'torch'", "vllm, speculators, sglang")),
        ("vllm==../x", ("not a release version",)),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_and_the_fix(argument, words):
    result = run_tasks(ns, "contracts.diff", argument)
    assert result.returncode == 2 and result.stdout == ""
    line = result.stderr.strip()
    assert "\n" not in line and "argument" in line and "fix:" in line
    for word in words:
        assert word in line


@given(st.text(max_size=30).filter(lambda t: "==" not in t))
def test_anything_but_name_equals_version_is_refused(text):
    with pytest.raises(UserError, match="argument: expected NAME==VERSION"):
        K.parse_spec(text)


def test_a_wheel_that_cannot_be_had_says_how_to_put_it_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path))

    def no_index(argv, **kwargs):
        return subprocess.CompletedProcess(
            argv, 1, "", "ERROR: No matching distribution found for vllm==9.9.9"
        )

    monkeypatch.setattr(wheels.subprocess, "run", no_index)
    with pytest.raises(wheels.ReleaseUnavailable) as info:
        wheels.release_wheel("vllm", OTHER, platform="manylinux_2_28_x86_64")
    text = str(info.value)
    assert "No matching distribution" in text and str(tmp_path) in text and wheels.CACHE_ENV in text
    assert "pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 vllm==9.9.9" in text
    assert isinstance(info.value, UserError) and "\n" not in text


# --- speculators and SGLang ----------------------------------------------------------------------------------------


def test_a_renamed_trainer_flag_and_a_removed_choice_are_reported(tmp_path):
    items = surface.speculators_items()
    flag, value = next(
        (lk[1], lk[2])
        for lk in used(items, "train-choice")
        if not lk[2].replace(".", "").isdigit() and "/" not in lk[2]
    )
    switch = next(lk[1] for lk in used(items, "train-flag") if lk[1] != flag)

    def schema(choices: list[str], switch_name: str) -> str:
        field = flag[2:].replace("-", "_")
        return (
            "from typing import Literal\nfrom pydantic import Field\n\nclass TrainConfig:\n"
            f"    {field}: Literal[{', '.join(map(repr, choices))}] = Field(default={choices[0]!r})\n"
            f"    {switch_name}: bool = Field(default=False)\n"
        )

    switch_field = switch[2:].replace("-", "_")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    pinned = sources(
        tmp_path / "a",
        "speculators",
        {clis.TRAIN_SCHEMA.replace(".", "/") + ".py": schema([value, "zz"], switch_field)},
    )
    other = sources(
        tmp_path / "b",
        "speculators",
        {clis.TRAIN_SCHEMA.replace(".", "/") + ".py": schema(["zz"], switch_field + "_renamed")},
    )
    by_name = {c.item: c for c in compare(items, pinned, other)[0]}
    assert by_name[f"speculators.train {switch}"].other == "absent"
    assert by_name[f"speculators.train {switch}"].features[0].startswith("train ")
    choice = by_name[f"speculators.train {flag} {value}"]
    assert (choice.kind, choice.pinned, choice.other) == ("literal", "admitted", "not admitted (admits: zz)")
    assert by_name[f"speculators.train {flag}"].pinned.startswith("takes one of: ")


def test_a_launch_server_switch_that_now_takes_a_value_is_reported(tmp_path):
    items = surface.sglang_items()
    flags = sorted({lk[1] for lk in used(items, "launch-flag")})

    def server_args(switch: bool) -> str:
        store_true = ", action='store_true'"
        calls = "".join(
            f"    parser.add_argument({f!r}{store_true if switch and f == '--enable-metrics' else ''})\n"
            for f in flags
        )
        return "def add_cli_args(parser):\n" + calls

    assert "--enable-metrics" in flags  # serve and bench scrape the metrics endpoint
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    pinned = sources(tmp_path / "a", "sglang", {"sglang/srt/server_args.py": server_args(True)})
    other = sources(tmp_path / "b", "sglang", {"sglang/srt/server_args.py": server_args(False)})
    (change,) = compare(items, pinned, other)[0]
    assert (change.item, change.pinned, change.other) == (
        "launch_server --enable-metrics",
        "switch",
        "takes a value",
    )
    assert set(change.features) == {"serve", "bench"}


def test_the_pins_are_the_kit_s_own():
    assert packages.PACKAGES["vllm"].pinned() == V.PINNED_VERSION
    lock = json.loads((Path(__file__).resolve().parents[3] / "images" / "images.lock.json").read_text())
    assert packages.PACKAGES["speculators"].pinned() == lock["images"]["train"]["versions"]["speculators"]
    assert packages.PACKAGES["sglang"].pinned() == lock["images"]["sglang"]["versions"]["sglang"]
    assert packages.PACKAGES["sglang"].platform.startswith("manylinux_2_34")


def test_requires_reads_an_exact_pin(tmp_path):
    wheel = make_wheel(
        tmp_path / "s.whl", "speculators", "1", {}, requires=("hs-connectors==1.2.3", "torch<=3")
    )
    assert packages.requires(wheels.Release(wheel), "hs-connectors") == "1.2.3"
    assert packages.requires(wheels.Release(wheel), "torch") is None
