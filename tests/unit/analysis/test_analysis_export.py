"""`invoke export --format csv|jsonl|parquet`: one row per record, the same rows in every format, read back.

The runs are the analysis tests' synthetic run directories (schema-valid, made through RunDir): a plain run, a
speculative run (per-step acceptance lengths) and a partial one. Each row is checked against its record
independently; the files are read back with the csv module, json and `datasets.Dataset.from_parquet`.
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import subprocess
import sys

import datasets
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from invoke import Collection
from test_analysis_synthetic import make_run

from draftscope.analysis import export
from draftscope.analysis.load import load_runs
from draftscope.cli.export import EXPORT_TASKS
from draftscope.core.errors import MissingDependency

from support import ROOT, run_tasks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    make_run(root / "A", seed=1, repeats=2)
    make_run(root / "S", seed=3, draft=True, repeats=1)
    make_run(root / "P", seed=4, status="timed_out", repeats=1)
    return root


@pytest.fixture(scope="module")
def table(folder):
    return list(export.rows(load_runs([folder])))


def cli(*args, cwd=None):
    """`invoke export ARGS` under the kit's parser, in this process: (exit code, stdout, stderr)."""
    done = run_tasks(Collection(*EXPORT_TASKS), *args, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def records(folder):
    return {
        (run, r["prompt_id"], r["repeat"]): r
        for run in ("A", "S", "P")
        for r in map(json.loads, (folder / run / "records.jsonl").read_text().splitlines())
    }


def test_one_row_per_record_with_the_records_own_figures(folder, table):
    source = records(folder)
    assert len(table) == len(source) and len(table) > 0
    assert all(tuple(row) == export.NAMES for row in table)
    for row in table:
        record = source[(row["run_id"], row["prompt_id"], row["repeat"])]
        stamps = record["token_timestamps"]
        assert row["generated_tokens"] == record["generated_tokens"] == len(stamps)
        assert row["request_seconds"] == record["request_seconds"]
        assert row["ttft_ms"] == pytest.approx(stamps[0] * 1000)
        assert row["tpot_ms"] == pytest.approx(
            (record["request_seconds"] - stamps[0]) / (record["generated_tokens"] - 1) * 1000
        )
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert row["itl_count"] == len(gaps)
        assert row["itl_median_ms"] == pytest.approx(statistics.median(gaps) * 1000)
        assert row["itl_max_ms"] == pytest.approx(max(gaps) * 1000)
    speculative = [row for row in table if row["run_id"] == "S"]
    plain = [row for row in table if row["run_id"] != "S"]
    # make_run's speculative records: lengths [3, 4, 2, 3] with k = 4 -> 4 steps, 8 accepted of 16 proposed.
    assert {(r["verification_steps"], r["accepted_drafts"], r["proposed_drafts"]) for r in speculative} == {
        (4, 8, 16)
    }
    assert {(r["acceptance_length"], r["acceptance_rate"], r["draft_tokens"]) for r in speculative} == {
        (3.0, 0.5, 4)
    }
    assert all(
        r["acceptance_source"] is None and r["draft"] is None and r["draft_tokens"] is None for r in plain
    )
    assert {r["run_status"] for r in table if r["run_id"] == "P"} == {
        "partial (timed_out: time limit of 5 s reached)"
    }


def test_csv_reads_back_row_for_row_with_the_csv_module(folder, table, tmp_path):
    out = tmp_path / "runs.csv"
    code, stdout, stderr = cli("export", str(folder), "--format", "csv", "--output", str(out))
    assert code == 0, stderr
    assert f"{len(table)} row(s) from 3 run(s)" in stdout
    with out.open(newline="", encoding="utf-8") as fh:
        lines = list(csv.reader(fh))
    assert tuple(lines[0]) == export.NAMES and len(lines) == len(table) + 1
    assert export.read_csv(out.read_text(encoding="utf-8")) == table


def test_jsonl_reads_back_row_for_row(folder, tmp_path):
    out = tmp_path / "runs.jsonl"
    runs = ("--run", str(folder / "S"), "--run", str(folder / "P"))
    assert cli("export", str(folder / "A"), *runs, "--format", "jsonl", "--output", str(out))[0] == 0
    table = list(export.rows(load_runs([folder / "A", folder / "S", folder / "P"])))  # in the order given
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == table


def test_parquet_has_the_typed_schema_and_loads_with_datasets(folder, table, tmp_path):
    out = tmp_path / "runs.parquet"
    code, _, stderr = cli("export", str(folder), "--format", "parquet", "--output", str(out))
    assert code == 0, stderr
    schema = pq.read_schema(out)
    assert schema.names == list(export.NAMES)
    assert {f.name: str(f.type) for f in schema} == {
        name: {"string": "string", "int64": "int64", "float64": "double"}[kind]
        for name, kind, _ in export.COLUMNS
    }
    loaded = datasets.Dataset.from_parquet(str(out), cache_dir=str(tmp_path / "hf-cache"))
    assert loaded.num_rows == len(table)
    assert loaded.column_names == list(export.NAMES)
    for got, want in zip(loaded, table, strict=True):
        assert got == want


def test_an_existing_output_is_never_overwritten(folder, tmp_path):
    out = tmp_path / "taken.csv"
    out.write_text("keep me")
    for fmt in ("csv", "jsonl", "parquet", "vllm-bench"):
        code, _, stderr = cli("export", str(folder / "A"), "--format", fmt, "--output", str(out))
        assert code == 2 and "already exists" in stderr and "--output" in stderr, stderr
    assert out.read_text() == "keep me"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((), ["--format", "no value given", "fix: add --format csv|jsonl|parquet|vllm-bench|mlflow"]),
        (("--format", "xlsx"), ["--format", "unknown format 'xlsx'", "choose one of: csv, jsonl"]),
        (("--format", "csv"), ["--output", "no output file given", "fix: add --output"]),
        (
            ("--format", "csv", "--output", "x.csv", "--tracking-uri", "sqlite:///m.db"),
            ["--tracking-uri", "only for"],
        ),
        (("--format", "mlflow"), ["--tracking-uri", "no tracking store given", "fix: add --tracking-uri"]),
        (
            ("--format", "mlflow", "--tracking-uri", "sqlite:///m.db", "--output", "x"),
            ["--output", "drop --output"],
        ),
    ],
)
def test_bad_options_are_one_line_naming_the_option_and_the_fix(folder, tmp_path, args, words):
    code, stdout, stderr = cli("export", str(folder / "A"), *args, cwd=tmp_path)
    assert code == 2, (stdout, stderr)
    line = stderr.strip()
    assert "\n" not in line and line.startswith("error:")
    for word in words:
        assert word in line
    assert list(tmp_path.iterdir()) == []


def test_a_run_given_twice_is_refused(folder, tmp_path):
    out = tmp_path / "x.csv"
    code, _, stderr = cli(
        "export", str(folder / "A"), "--run", str(folder), "--format", "csv", "--output", str(out)
    )
    assert code == 2 and "run A is given twice" in stderr and "fix: name each run once" in stderr
    assert not out.exists()


def test_a_missing_pyarrow_names_the_extra_to_install(table, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(MissingDependency) as caught:
        export.parquet_bytes(table)
    assert "pyarrow" in str(caught.value) and "draftscope[export]" in str(caught.value)


def test_the_cli_names_the_missing_extra_in_a_fresh_interpreter(folder, tmp_path):
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from draftscope.cli import main\n"
        f"sys.argv = ['draftscope', 'export', {str(folder / 'A')!r}, '--format', 'parquet', "
        f"'--output', {str(tmp_path / 'x.parquet')!r}]\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "pyarrow" in done.stderr and "pip install 'draftscope[export]'" in done.stderr
    assert not (tmp_path / "x.parquet").exists()


# Hostile prompt ids: separators, quotes, line breaks (CR, LF, so CRLF too, U+2028, NEL), unicode, spaces.
HOSTILE = st.text(
    alphabet=st.one_of(
        st.sampled_from(
            [",", '"', "'", "\n", "\r", "\u2028", "\x85", "\t", " ", ";", "\\", "=", "é", "🙂", "中"]
        ),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    min_size=1,  # CSV reads an empty field as null (export.csv_bytes)
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(HOSTILE, min_size=1, max_size=5))
def test_hostile_prompt_ids_survive_csv_and_jsonl(table, ids):
    rows = [{**table[i % len(table)], "prompt_id": pid} for i, pid in enumerate(ids)]
    assert export.read_csv(export.csv_bytes(rows).decode("utf-8")) == rows
    text = export.jsonl_bytes(rows).decode("utf-8")
    assert text.isascii() and text.endswith("\n")  # no character any reader takes for a line break
    assert [json.loads(line) for line in text.splitlines()] == rows


def test_the_exports_page_names_every_column_and_every_vllm_field_left_out():
    from draftscope.analysis.vllm_bench import LEFT_OUT

    page = (ROOT / "docs" / "use" / "exports.md").read_text(encoding="utf-8")
    for name in (*export.NAMES, *LEFT_OUT):
        assert f"| `{name}` |" in page, name
