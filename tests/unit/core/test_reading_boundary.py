"""The reading boundary (core/jsonio.py, core/config.py): every reader of a file, given anything at all, returns the
parsed value or raises a UserError that names the file; never another exception, never a hang.

Property tests generate hostile documents (deep nesting, huge integers, long number literals, duplicate keys, NaN
and Infinity, YAML anchors, aliases, alias bombs and self-references, random bytes, random valid and broken
JSON/YAML) and run each through every reader, with a small deadline per example. Example tests cover what is not
a document: a FIFO, a directory, a device, a file over the size limit, an overlong JSON Lines line.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from draftscope.bench.plan import load_prompts
from draftscope.core.config import load_yaml, parse_opts, parse_yaml
from draftscope.core.errors import UserError
from draftscope.core.jsonio import (
    MAX_DEPTH,
    MAX_NUMBER_CHARS,
    iter_jsonl,
    parse_json,
    read_bytes,
    read_json,
    repair_tail,
)

PROPERTY = settings(
    max_examples=150,
    deadline=timedelta(seconds=2),  # generous for a slow CI machine; a hang or a blow-up is minutes
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the readers ------------------------------------------------------------------------------------------------


def _jsonl(path: Path) -> list[tuple[int, Any]]:
    return list(iter_jsonl(path))


def _jsonl_hand_written(path: Path) -> list[tuple[int, Any]]:
    return list(iter_jsonl(path, final_newline=False))


READERS: dict[str, Callable[[Path], Any]] = {
    "read_json": read_json,
    "read_json(expect=dict)": lambda p: read_json(p, expect=dict),
    "iter_jsonl": _jsonl,
    "iter_jsonl(final_newline=False)": _jsonl_hand_written,
    "load_yaml": load_yaml,
    "load_yaml(expect=dict)": lambda p: load_yaml(p, expect=dict),
    "load_prompts": lambda p: load_prompts(str(p)),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reading")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _no_bad_floats(value: Any) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return False
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def outcome(reader: Callable[[Path], Any], path: Path) -> Any:
    """The reader's value, or its UserError; anything else fails the test. A UserError must name the file."""
    try:
        value = reader(path)
    except UserError as exc:
        assert str(path) in exc.render(), exc.render()
        assert "\n" not in exc.render()
        return exc
    # What comes back is within the limits the boundary promises.
    assert _depth(value) <= MAX_DEPTH + 1  # iter_jsonl's list of (number, record) adds one level here
    assert _no_bad_floats(value)
    return value


def check_every_reader(folder: Path, name: str, data: bytes) -> dict[str, Any]:
    path = folder / name
    path.write_bytes(data)
    try:
        return {label: outcome(reader, path) for label, reader in READERS.items()}
    finally:
        path.unlink()


def check_text_parsers(data: bytes) -> None:
    for parse in (parse_json, parse_yaml):
        try:
            parse(data, "doc.txt")
        except UserError as exc:
            assert exc.source == "doc.txt"


# --- hostile documents ------------------------------------------------------------------------------------------


def nested(depth: int, kinds: str) -> str:
    opens = "".join('{"k": ' if kinds[i % len(kinds)] == "o" else "[" for i in range(depth))
    closes = "".join("}" if kinds[i % len(kinds)] == "o" else "]" for i in reversed(range(depth)))
    return opens + "1" + closes


def alias_bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [lol, lol]"]
    for level in range(1, levels):
        refs = ", ".join(f"*a{level - 1}" for _ in range(width))
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20)
json_scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

hostile_json = st.one_of(
    st.builds(nested, st.integers(MAX_DEPTH + 1, 3000), st.sampled_from(["a", "o", "ao"])),
    st.integers(MAX_NUMBER_CHARS + 1, 20_000).map(lambda n: '{"n": ' + "7" * n + "}"),
    st.integers(MAX_NUMBER_CHARS, 5000).map(lambda n: '{"n": 1.' + "5" * n + "}"),
    st.sampled_from(["1e999", "-1e999", "[1e400]", '{"x": 1E+99999}', "0." + "0" * 400 + "1"]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", '{"x": NaN}', "[Infinity]"]),
    st.builds(
        lambda key, a, b: json.dumps({key: a})[:-1] + ", " + json.dumps(key) + ": " + json.dumps(b) + "}",
        st.text(max_size=6),
        json_values,
        json_values,
    ),
)

hostile_yaml = st.one_of(
    st.builds(alias_bomb, st.integers(2, 12), st.integers(2, 12)),
    st.sampled_from(
        [
            "a: &a [*a]\n",
            "&a [*a, *a]\n",
            "a: &x 1\nb: *x\n",
            "a: &x\n  b: 1\nc: *x\n",
            "base: &b {k: 1}\nuse:\n  <<: *b\n",
            "- &a\n  - *a\n",
            "*undefined\n",
            "a: 1\na: 2\n",
            "{a: 1, a: 1}\n",
            "x: .nan\n",
            "x: -.inf\n",
            "x: 2025-02-30\n",
            "x: !!python/object/apply:os.system [true]\n",
            "x: !!binary aGVsbG8=\n",
            "? [a, b]\n: 1\n",
            "a: b\n---\nc: d\n",
            "\x00\x01",
            "%YAML 1.1\n---\nx: 1\n",
        ]
    ),
    st.builds(lambda n: "- " * n + "x\n", st.integers(1, 2000)),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(1, 2000)),
    st.builds(
        lambda n: "".join(" " * i + f"k{i}:\n" for i in range(n)) + " " * n + "v\n", st.integers(1, 150)
    ),
    st.integers(MAX_NUMBER_CHARS - 5, 20_000).map(lambda n: "x: " + "9" * n + "\n"),
    st.integers(MAX_NUMBER_CHARS - 5, 5000).map(lambda n: "x: 0b" + "1" * n + "\n"),
)


def _plain_yaml(value: Any) -> str:
    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump(value, Dumper=Dumper)


documents = st.one_of(
    hostile_json.map(str.encode),
    st.integers(MAX_NUMBER_CHARS - 3, MAX_NUMBER_CHARS + 3).map(lambda n: ("[" + "7" * n + "]").encode()),
    hostile_yaml.map(str.encode),
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: _plain_yaml(v).encode()),
    # broken: a valid document cut short, or with a byte dropped in
    st.tuples(json_values, st.integers(0, 200)).map(lambda t: json.dumps(t[0]).encode()[: t[1]]),
    st.tuples(json_values, st.integers(0, 200), st.binary(min_size=1, max_size=3)).map(
        lambda t: json.dumps(t[0]).encode()[: t[1]] + t[2] + json.dumps(t[0]).encode()[t[1] :]
    ),
)


# --- properties -------------------------------------------------------------------------------------------------


@PROPERTY
@given(data=documents)
def test_every_reader_returns_a_value_or_a_user_error_naming_the_file(folder: Path, data: bytes):
    check_every_reader(folder, "doc.json", data)
    check_text_parsers(data)


@PROPERTY
@given(data=hostile_json)
def test_hostile_json_is_refused(folder: Path, data: str):
    seen = check_every_reader(folder, "hostile.json", data.encode())
    assert isinstance(seen["read_json"], UserError), data[:200]


@PROPERTY
@given(data=st.builds(alias_bomb, st.integers(2, 12), st.integers(2, 12)))
def test_an_alias_bomb_is_refused_before_it_expands(folder: Path, data: str):
    seen = check_every_reader(folder, "bomb.yaml", data.encode())
    assert "YAML anchors and aliases are not accepted" in str(seen["load_yaml"])


@PROPERTY
@given(value=json_values)
def test_valid_json_reads_back_as_the_standard_library_reads_it(folder: Path, value: Any):
    text = json.dumps(value)
    seen = check_every_reader(folder, "ok.json", text.encode())
    assert seen["read_json"] == json.loads(text)
    assert seen["load_yaml"] == yaml.safe_load(text) or isinstance(seen["load_yaml"], UserError)
    line = check_every_reader(folder, "ok.jsonl", (text + "\n").encode())
    assert line["iter_jsonl"] == [(1, json.loads(text))]


@PROPERTY
@given(value=json_values)
def test_valid_yaml_reads_back_as_safe_load_reads_it(folder: Path, value: Any):
    text = _plain_yaml(value)
    seen = check_every_reader(folder, "ok.yaml", text.encode())
    assert seen["load_yaml"] == yaml.safe_load(text)


@PROPERTY
@given(depth=st.integers(1, 5000), kinds=st.sampled_from(["a", "o", "ao"]))
def test_nesting_is_refused_past_the_limit_and_only_there(depth: int, kinds: str):
    text = nested(depth, kinds)
    if depth <= MAX_DEPTH:
        assert _depth(parse_json(text, "n.json")) == depth
    else:
        with pytest.raises(UserError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse_json(text, "n.json")
    flow = "[" * depth + "]" * depth
    if depth <= MAX_DEPTH:
        assert _depth(parse_yaml(flow, "n.yaml")) == depth
    else:
        with pytest.raises(UserError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse_yaml(flow, "n.yaml")


@PROPERTY
@given(raw=st.text(max_size=60) | hostile_yaml | st.builds(lambda n: "[" * n, st.integers(60, 3000)))
def test_opts_values_are_data_or_a_user_error(raw: str):
    assume("\x00" not in raw)
    try:
        parsed = parse_opts([f"name={raw}"])
    except UserError as exc:
        assert exc.field == "--opts"
        return
    assert set(parsed) == {"name"}
    assert _depth(parsed) <= MAX_DEPTH + 1


# --- examples: what the messages say -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
        ("[" * 50_000 + "]" * 50_000, "nested deeper than 64 levels"),  # past Python's recursion limit
        ('{"n": ' + "1" * 5000 + "}", "a number literal of 5000 digits"),
        ('{"n": ' + "1" * 4301 + "}", "a number literal of 4301 digits"),  # past Python's own int limit
        ('{"a": 1, "a": 2}', "the key 'a' appears twice"),
        ('{"x": NaN}', "NaN is not JSON"),
        ("[-Infinity]", "-Infinity is not JSON"),
        ("[1e999]", "out of the range of a double"),
        ("", "the file is empty"),
        ("\ufeff{}", "byte-order mark"),
        ("[1, 2]", "expected a JSON object at the top level, got a JSON array"),
        ('"text"', "expected a JSON object at the top level, got a string"),
        ("null", "expected a JSON object at the top level, got null"),
    ],
)
def test_json_refusals_name_the_problem(folder: Path, text: str, phrase: str):
    path = folder / "m.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as err:
        read_json(path, expect=dict)
    assert err.value.source == str(path) and phrase in err.value.message, err.value.render()
    assert err.value.fix


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        (alias_bomb(10, 10), "YAML anchors and aliases are not accepted at line 1"),
        ("a: &a [*a]\n", "YAML anchors and aliases are not accepted"),
        ("a: 1\nb: *a\n", "YAML anchors and aliases are not accepted at line 2"),
        ("name: x\nrepeats: 1\nname: y\n", "the key 'name' appears twice in one mapping (lines 1 and 3)"),
        ("- " * 100 + "x\n", "nested deeper than 64 levels"),
        ("x: " + "9" * 5000 + "\n", "a number literal of 5000 characters"),
        ("x: .nan\n", ".nan is not a finite number"),
        ("x: 2025-02-30\n", "a value cannot be read"),
        ("x: !!python/object/apply:os.system [true]\n", "could not determine a constructor"),
        ("- 1\n", "expected a mapping at the top level, got a list"),
        ("name: [unclosed\n", "not valid YAML at line 2"),
    ],
)
def test_yaml_refusals_name_the_problem(folder: Path, text: str, phrase: str):
    path = folder / "c.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as err:
        load_yaml(path, expect=dict)
    assert err.value.source == str(path) and phrase in err.value.message, err.value.render()
    assert err.value.fix


def test_yaml_merge_keys_without_aliases_still_work(folder: Path):
    assert parse_yaml("<<: {a: 1, b: 2}\nb: 3\n", "m.yaml") == {"a": 1, "b": 3}


def test_opts_refuse_aliases_and_deep_values():
    with pytest.raises(UserError, match="anchors and aliases"):
        parse_opts(["vllm=&a [*a]"])
    with pytest.raises(UserError, match="nested deeper"):
        parse_opts(["x=" + "[" * 5000])
    assert parse_opts(["name=a&b", "x=*"]) == {"name": "a&b", "x": "*"}  # plain text stays text


# --- not a document: FIFOs, directories, devices, size and line limits --------------------------------------------


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> BaseException | Any:
    """fn's result or exception, or a test failure when it does not return in time (a blocked open or read)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader blocked"
    return box[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("reader", list(READERS), ids=list(READERS))
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, reader: str):
    fifo = tmp_path / "prompts.json"
    os.mkfifo(fifo)
    result = finishes(lambda: READERS[reader](fifo))
    assert isinstance(result, UserError), result
    assert "named pipe" in result.message and result.source == str(fifo)


@pytest.mark.parametrize("reader", list(READERS), ids=list(READERS))
def test_a_directory_is_refused(tmp_path: Path, reader: str):
    result = finishes(lambda: READERS[reader](tmp_path))
    assert isinstance(result, UserError) and "a directory" in result.message, result


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_a_device_is_refused():
    result = finishes(lambda: read_json(Path("/dev/zero")))
    assert isinstance(result, UserError) and "character device" in result.message, result


def test_a_missing_file_is_named(tmp_path: Path):
    for reader in (read_json, load_yaml, lambda p: list(iter_jsonl(p))):
        with pytest.raises(UserError, match="file not found"):
            reader(tmp_path / "nope.json")


def test_size_is_checked_before_reading(tmp_path: Path):
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:  # sparse: nothing is written, and nothing must be read
        fh.truncate(65 * 2**20)
    with pytest.raises(UserError, match="the file is 65 MiB; the limit is 64 MiB"):
        read_json(huge)
    small = tmp_path / "small.json"
    small.write_text('{"a": 1}')
    assert read_json(small, limit=8) == {"a": 1}
    with pytest.raises(UserError, match="the limit is 7 bytes"):
        read_json(small, limit=7)
    assert read_bytes(small) == b'{"a": 1}'


def test_yaml_has_its_own_smaller_limit(tmp_path: Path):
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(5 * 2**20)
    with pytest.raises(UserError, match="the limit is 4 MiB"):
        load_yaml(big)


def test_jsonl_streams_and_bounds_each_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n' + b'{"c": "' + b"x" * 100 + b'"}\n')
    assert [n for n, _ in iter_jsonl(path)] == [1, 3, 4]
    with pytest.raises(UserError, match="line 4 is longer than 100 bytes"):
        list(iter_jsonl(path, max_line=100))
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    with pytest.raises(UserError, match="line 2 is incomplete"):
        list(iter_jsonl(path))
    assert list(iter_jsonl(path, final_newline=False)) == [(1, {"a": 1}), (2, {"b": 2})]
    path.write_bytes(b'{"a": 1}\n{"a": 1, "a": 2}\n')
    with pytest.raises(UserError, match="line 2: the key 'a' appears twice"):
        list(iter_jsonl(path))
    path.write_bytes(b'{"a": 1}\n\xff\n')
    with pytest.raises(UserError, match="line 2: not UTF-8"):
        list(iter_jsonl(path))


def test_repair_tail_survives_a_deep_torn_line(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"[" * 100_000)
    assert repair_tail(path) == 100_000
    assert path.read_bytes() == b'{"a": 1}\n'


def test_load_prompts_hashes_the_bytes_it_checked(tmp_path: Path):
    import hashlib

    path = tmp_path / "p.json"
    path.write_text(
        '{"schema_version": 1, "name": "p", "prompts": [{"id": "a", "messages": [{"role": "user", "content": "hi"}]}]}'
    )
    prompts = load_prompts(str(path))
    assert prompts.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and prompts.count == 1
    path.write_text("[1]")
    with pytest.raises(UserError, match="expected a JSON object at the top level"):
        load_prompts(str(path))


def test_unreachable_paths_are_user_errors(tmp_path):
    """A NUL byte (ValueError from the OS layer) and a name longer than the system allows (ENAMETOOLONG)."""
    for path in (tmp_path / "a\0b.json", tmp_path / ("n" * 10_000 + ".json")):
        with pytest.raises(UserError):
            read_json(path)
