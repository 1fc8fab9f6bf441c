"""Runs → one flat row per record, written as CSV, JSON lines or Parquet (docs/use/exports.md names every column).

The same rows for every format, in the order of `COLUMNS`: the run's identity (run id, status, backend, preset,
target and draft as `repo@revision`, k, prompts hash), the record's own figures (tokens, request seconds and
rates, finish reason), its timing from the per-token timestamps (TTFT, TPOT and inter-token latencies, in
milliseconds, defined as `vllm bench serve` defines them, `timing`) and its acceptance counts (the acceptance
ledger of core/acceptance.py over this one record). A figure the record cannot give is empty (CSV) or null.

CSV and JSON lines need nothing beyond the standard library; Parquet is written through pyarrow with an explicit
schema (the `export` extra). Every output is created exclusively and atomically (analysis/output.py).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from draftscope.analysis import timing
from draftscope.analysis.load import Run
from draftscope.analysis.output import refuse_existing, write_new
from draftscope.core import acceptance
from draftscope.core.errors import MissingDependency, UserError

# (name, type, what it holds). Types: string, int64, float64, bool; every column may be null.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("run_id", "string", "the run directory's name (manifest run_id)"),
    ("run_status", "string", "the run's status: completed, or why it is partial"),
    ("backend", "string", "the backend (transformers, vllm, sglang), with int4+dflash2 / +prefix marks"),
    ("config_name", "string", "the experiment preset the run was made from"),
    ("model_preset", "string", "the model preset"),
    ("target", "string", "the target model as repo@revision (or the kit-built model)"),
    ("draft", "string", "the draft model as repo@revision; null for a plain run"),
    ("draft_tokens", "int64", "k, the draft tokens proposed per verification step; null for a plain run"),
    ("dtype", "string", "the weights' dtype the backend used"),
    ("device", "string", "cpu or cuda"),
    ("prompts_sha256", "string", "SHA-256 of the prompts file the run read"),
    ("prompt_id", "string", "the prompt's id in the prompts file"),
    ("prompt_sha256", "string", "SHA-256 of the prompt's messages"),
    ("repeat", "int64", "the repeat index (0-based)"),
    ("prompt_tokens", "int64", "tokens in the prompt"),
    ("generated_tokens", "int64", "tokens generated"),
    ("finish_reason", "string", "eos, length, fixed_tokens or stop"),
    ("request_seconds", "float64", "seconds from sending the request to its last token"),
    ("request_tok_s", "float64", "generated tokens / request_seconds"),
    (
        "decode_tok_s",
        "float64",
        "tokens after the first / time after the first token; null where not measured",
    ),
    ("ttft_ms", "float64", "milliseconds to the first generated token"),
    ("tpot_ms", "float64", "(request - TTFT) / (generated tokens - 1), ms; null for one token"),
    (
        "itl_count",
        "int64",
        "inter-token latencies: gaps between token arrivals (tokens arriving together: one)",
    ),
    ("itl_mean_ms", "float64", "mean inter-token latency, ms"),
    ("itl_median_ms", "float64", "median inter-token latency, ms"),
    ("itl_p99_ms", "float64", "99th percentile inter-token latency (linear interpolation), ms"),
    ("itl_max_ms", "float64", "largest inter-token latency, ms"),
    ("timing_source", "string", "how the per-token timestamps were taken"),
    ("acceptance_source", "string", "where the acceptance counts come from; null for a plain run"),
    ("verification_steps", "int64", "verification steps of this request"),
    ("accepted_drafts", "int64", "drafted tokens the target accepted"),
    ("proposed_drafts", "int64", "drafted tokens proposed; null where the drafts per step are not known"),
    (
        "acceptance_length",
        "float64",
        "tokens per verification step (accepted drafts + 1, averaged over steps)",
    ),
    ("acceptance_rate", "float64", "accepted_drafts / proposed_drafts"),
)
NAMES = tuple(name for name, _, _ in COLUMNS)
TYPES = {name: kind for name, kind, _ in COLUMNS}
FORMATS = ("csv", "jsonl", "parquet")


def run_fields(run: Run) -> dict[str, Any]:
    """The columns every row of `run` shares."""
    config = run.config
    return {
        "run_id": run.run_id,
        "run_status": run.status_label,
        "backend": run.backend,
        "config_name": _text(config.get("name")),
        "model_preset": _text(config.get("model_preset")),
        "target": run.target,
        "draft": run.draft,
        "draft_tokens": config.get("draft_tokens") if run.draft else None,
        "dtype": run.dtype,
        "device": _text(config.get("device")),
        "prompts_sha256": run.prompts_sha256,
    }


def record_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The columns of one record: its own figures, its timing and its acceptance counts."""
    stamps = record.get("token_timestamps")
    gaps = timing.itls(stamps)
    ledger = acceptance.from_records([record])
    return {
        "prompt_id": record["prompt_id"],
        "prompt_sha256": record["prompt_sha256"],
        "repeat": record["repeat"],
        "prompt_tokens": record["prompt_tokens"],
        "generated_tokens": record["generated_tokens"],
        "finish_reason": record["finish_reason"],
        "request_seconds": float(record["request_seconds"]),
        "request_tok_s": float(record["request_tok_s"]),
        "decode_tok_s": _float(record.get("decode_tok_s")),
        "ttft_ms": _ms(timing.ttft(stamps)),
        "tpot_ms": _ms(timing.tpot(record)),
        "itl_count": len(gaps) if gaps is not None else None,
        "itl_mean_ms": _ms(timing.mean(gaps)),
        "itl_median_ms": _ms(timing.median(gaps)),
        "itl_p99_ms": _ms(timing.percentile(gaps, 99)),
        "itl_max_ms": _ms(max(gaps) if gaps else None),
        "timing_source": record["timing_source"],
        "acceptance_source": ledger["source"] if ledger else None,
        "verification_steps": ledger["steps"] if ledger else None,
        "accepted_drafts": ledger["accepted_drafts"] if ledger else None,
        "proposed_drafts": ledger["proposed_drafts"] if ledger else None,
        "acceptance_length": ledger["mean_pooled"] if ledger else None,
        "acceptance_rate": ledger["rate"] if ledger else None,
    }


def rows(runs: Iterable[Run]) -> Iterator[dict[str, Any]]:
    """One row per record of each run, in `COLUMNS` order."""
    for run in runs:
        shared = run_fields(run)
        for record in run.records:
            row = {**shared, **record_fields(record)}
            yield {name: row[name] for name in NAMES}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


# --- the formats ---------------------------------------------------------------------------------------------------


def csv_bytes(table: Sequence[Mapping[str, Any]]) -> bytes:
    """RFC 4180 CSV with a header row; null is an empty field, a bool is true/false, a float its shortest repr.

    CSV cannot tell an empty string from an empty field: an empty field reads back as null (no column of the kit
    holds an empty string; prompt ids are names of at least one character)."""
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(NAMES)
    for row in table:
        writer.writerow(_csv_cell(row[name]) for name in NAMES)
    return out.getvalue().encode("utf-8")


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def read_csv(text: str) -> list[dict[str, Any]]:
    """Rows written by `csv_bytes`, with each column's type restored (an empty field is null)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    if tuple(header) != NAMES:
        raise UserError("not a draftscope export (unexpected header)", value=",".join(header)[:80])
    casts = {"int64": int, "float64": float, "bool": lambda v: v == "true", "string": str}
    return [
        {
            name: (casts[TYPES[name]](cell) if cell != "" else None)
            for name, cell in zip(NAMES, line, strict=True)
        }
        for line in reader
    ]


def jsonl_bytes(table: Sequence[Mapping[str, Any]]) -> bytes:
    """One JSON object per line, keys in `COLUMNS` order. Non-ASCII characters are \\u-escaped, so that no
    reader splits a line at a character it takes for a line break (U+2028, U+0085, ...)."""
    lines = [json.dumps({n: row[n] for n in NAMES}, allow_nan=False) for row in table]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def arrow_schema() -> Any:
    """The Parquet file's schema: one typed, nullable field per column, each with its description."""
    pa = require("pyarrow")
    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    return pa.schema(
        [
            pa.field(name, types[kind], nullable=True, metadata={"description": about})
            for name, kind, about in COLUMNS
        ],
        metadata={"producer": "draftscope export", "columns": "docs/use/exports.md"},
    )


def parquet_bytes(table: Sequence[Mapping[str, Any]]) -> bytes:
    pa = require("pyarrow")
    pq = require("pyarrow.parquet")
    arrow = pa.Table.from_pylist([dict(row) for row in table], schema=arrow_schema())
    sink = pa.BufferOutputStream()
    pq.write_table(arrow, sink)
    return sink.getvalue().to_pybytes()


WRITERS = {"csv": csv_bytes, "jsonl": jsonl_bytes, "parquet": parquet_bytes}


def require(module: str) -> Any:
    """Import an optional dependency of the `export` extra; its absence names the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(module.split(".")[0], extra="export") from None


def export_rows(runs: Sequence[Run], fmt: str, output: Path) -> int:
    """Write the rows of `runs` to `output` (a new file) in `fmt`; the number of rows written."""
    if fmt not in WRITERS:
        raise UserError(
            "unknown table format", field="--format", value=fmt, fix=f"use one of {', '.join(FORMATS)}"
        )
    refuse_existing(output, "--output")  # before any work
    table = list(rows(runs))
    write_new(output, WRITERS[fmt](table), "--output")
    return len(table)
