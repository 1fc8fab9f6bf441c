"""The prompt-set importers (`draftscope.core.importers`): a sample in each original format, read into the kit's
prompts format with its provenance; every malformed question refused by file, line, field, value and fix."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftscope.bench.plan import load_prompts
from draftscope.core import importers
from draftscope.core.datasets import UPSTREAM, shipped
from draftscope.core.errors import UserError
from draftscope.core.schema import problems

from support import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "datasets"


def upstream_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines()]


def test_mt_bench_sample_reads_first_turns_with_its_provenance():
    path = FIXTURES / "mt_bench_question.jsonl"
    doc = importers.convert("mt-bench", path, name="mt-bench")
    assert problems(doc, "prompts") == []
    rows = upstream_lines("mt_bench_question.jsonl")
    assert [p["id"] for p in doc["prompts"]] == [str(r["question_id"]) for r in rows] == ["81", "82", "111"]
    assert [p["category"] for p in doc["prompts"]] == ["writing", "writing", "math"]
    for prompt, row in zip(doc["prompts"], rows, strict=True):
        assert prompt["messages"] == [{"role": "user", "content": row["turns"][0]}]
    source = doc["source"]
    assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (source["format"], source["turns"], source["later_turns_dropped"]) == ("mt-bench", "first", 3)
    assert "commit" not in source  # a sample is not the pinned upstream file: no provenance is claimed for it


def test_mt_bench_sample_converts_to_the_shipped_sets_prompts():
    """The real upstream lines give, through the importer, exactly the prompts the kit ships for them."""
    doc = importers.convert("mt-bench", FIXTURES / "mt_bench_question.jsonl", name="mt-bench")
    ship = {p["id"]: p for p in json.loads(shipped("mt-bench").path.read_text(encoding="utf-8"))["prompts"]}
    for prompt in doc["prompts"]:
        assert ship[prompt["id"]] == prompt


def test_spec_bench_sample_keeps_its_categories():
    doc = importers.convert("spec-bench", FIXTURES / "spec_bench_question.jsonl", name="spec-bench")
    assert problems(doc, "prompts") == []
    assert [p["id"] for p in doc["prompts"]] == ["81", "161", "321", "401"]
    assert [p["category"] for p in doc["prompts"]] == ["writing", "translation", "qa", "math_reasoning"]
    assert doc["prompts"][1]["messages"][0]["content"].startswith("Translate German to English: ")
    assert doc["source"]["later_turns_dropped"] == 1  # the MT-Bench question's second turn


def test_speed_bench_rows_as_json_lines():
    doc = importers.convert("speed-bench", FIXTURES / "speed_bench_rows.jsonl", name="speed-sample")
    assert problems(doc, "prompts") == []
    assert [p["id"] for p in doc["prompts"]] == ["b3f1c2a0e4d5", "9a7e6d5c4b3a", "0c1d2e3f4a5b"]
    assert [p["category"] for p in doc["prompts"]] == ["coding", "multilingual", "rag"]
    assert doc["prompts"][2]["messages"][0]["content"].startswith("Context:\nThe Nile")
    assert doc["source"]["later_turns_dropped"] == 1


def test_speed_bench_parquet_reads_the_same_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = upstream_lines("speed_bench_rows.jsonl")
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    from_parquet = importers.convert("speed-bench", path, name="speed-sample")
    from_jsonl = importers.convert("speed-bench", FIXTURES / "speed_bench_rows.jsonl", name="speed-sample")
    assert from_parquet["prompts"] == from_jsonl["prompts"]
    assert from_parquet["source"]["file"] == "test.parquet"


def test_the_pinned_upstream_file_is_recognised_by_its_hash(tmp_path, monkeypatch):
    """An upstream file whose SHA-256 the kit pins gets its repository, path, commit and licence recorded."""
    path = FIXTURES / "mt_bench_question.jsonl"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setitem(UPSTREAM, "mt-bench", replace(UPSTREAM["mt-bench"], sha256=digest))
    source = importers.convert("mt-bench", path, name="x")["source"]
    up = UPSTREAM["mt-bench"]
    assert (source["repository"], source["path"], source["commit"], source["licence"]) == (
        up.repository,
        up.path,
        up.commit,
        up.licence,
    )


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = '{"question_id": 1, "category": "writing", "turns": ["Hello"]}'


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ('{"question_id": 2, "category": "writing", "turns": []}', "turns", "non-empty list"),
        ('{"question_id": 2, "category": "writing", "turns": ["  "]}', "turns[0]", "empty turn"),
        ('{"question_id": 2, "category": "writing", "turns": ["a", 3]}', "turns[1]", "expected a string"),
        ('{"question_id": 2, "category": "writing", "turns": "Hello"}', "turns", "non-empty list"),
        ('{"question_id": true, "category": "writing", "turns": ["a"]}', "question_id", "integer"),
        ('{"question_id": "2", "category": "writing", "turns": ["a"]}', "question_id", "integer"),
        ('{"question_id": 2, "turns": ["a"]}', "category", "non-empty string"),
        ('{"question_id": 1, "category": "writing", "turns": ["again"]}', "question_id", "duplicate"),
        ('{"question_id": 2, "category": "writing", "turns": ["a"]', None, "line 2"),
        ("[1, 2]", None, "line 2"),
    ],
)
def test_a_malformed_line_is_named_with_its_file_line_field_and_fix(tmp_path, line, field, words):
    path = _write(tmp_path, GOOD, line)
    with pytest.raises(UserError) as caught:
        importers.convert("mt-bench", path, name="x")
    text = str(caught.value)
    assert str(path) in text and "line 2" in text and words in text
    if field is not None:
        assert caught.value.field == field and caught.value.fix
    if words == "duplicate":
        assert "line 1" in text  # where the first one is


def test_speed_bench_placeholder_turn_is_refused_with_the_fix(tmp_path):
    row = {"question_id": "a1", "category": "qa", "turns": [importers.SPEED_PLACEHOLDER + "\n\n{question}"]}
    path = _write(tmp_path, json.dumps(row))
    with pytest.raises(UserError, match="placeholder") as caught:
        importers.convert("speed-bench", path, name="x")
    assert "prepare_data.py" in caught.value.fix


def test_empty_file_unknown_format_and_bad_ids_are_refused(tmp_path):
    with pytest.raises(UserError, match="no questions"):
        importers.convert("mt-bench", _write(tmp_path, ""), name="x")
    with pytest.raises(UserError, match="one of: mt-bench, spec-bench, speed-bench"):
        importers.check_format("sharegpt")
    with pytest.raises(UserError, match="not a prompt-set name") as caught:
        importers.convert("mt-bench", FIXTURES / "mt_bench_question.jsonl", name="MT Bench")
    assert caught.value.field == "--name"
    row = {"question_id": "-" + "x" * 70, "category": "qa", "turns": ["a"]}
    with pytest.raises(UserError, match="prompt id"):
        importers.convert("speed-bench", _write(tmp_path, json.dumps(row)), name="x")


def test_write_new_writes_a_loadable_file_and_never_overwrites(tmp_path):
    doc = importers.convert("mt-bench", FIXTURES / "mt_bench_question.jsonl", name="mt-sample")
    out = tmp_path / "prompts.json"
    importers.write_new(doc, out)
    assert load_prompts(str(out)).count == 3
    before = out.read_bytes()
    with pytest.raises(UserError, match="never overwritten"):
        importers.write_new(doc, out)
    assert out.read_bytes() == before


TEXT = st.characters(exclude_categories=("Cs",))  # a lone surrogate cannot be written as UTF-8
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(TEXT, max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(TEXT, max_size=6), inner, max_size=3),
    max_leaves=8,
)
ROWS = st.fixed_dictionaries(
    {},
    optional={
        "question_id": st.integers(-2, 5) | st.text(TEXT, max_size=5) | st.booleans() | JSON_VALUES,
        "category": st.text(TEXT, max_size=5) | JSON_VALUES,
        "turns": st.lists(st.text(TEXT, max_size=5) | JSON_VALUES, max_size=3) | JSON_VALUES,
    },
)
LINES = st.one_of(ROWS.map(json.dumps), JSON_VALUES.map(json.dumps), st.text(TEXT, max_size=20))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINES, max_size=5), fmt=st.sampled_from(importers.FORMATS))
def test_hostile_lines_give_a_valid_prompt_file_or_one_named_error(tmp_path, lines, fmt):
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(line.replace("\n", " ") for line in lines), encoding="utf-8")
    try:
        doc = importers.convert(fmt, path, name="hostile")
    except UserError as exc:
        text = str(exc)
        assert str(path) in text and "\n" not in text
        return
    assert problems(doc, "prompts") == []
    assert len({p["id"] for p in doc["prompts"]}) == len(doc["prompts"])
