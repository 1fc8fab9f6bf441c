"""Importers for the public speculative-decoding prompt sets, from their original formats into the kit's prompts
format (schemas/prompts.schema.json).

- `mt-bench`: FastChat's `fastchat/llm_judge/data/mt_bench/question.jsonl`, JSON lines of
  `{"question_id": int, "category": str, "turns": [str, ...], "reference": [...]?}`.
- `spec-bench`: Spec-Bench's `data/spec_bench/question.jsonl`, the same JSON-lines shape (its first 80 lines are
  MT-Bench; then translation, summarization, qa, math_reasoning and rag).
- `speed-bench`: NVIDIA's SPEED-Bench (a Hugging Face dataset in Parquet) as its rows: `question_id` (str),
  `category`, `sub_category`, `turns` [str], `source`, `src_id`, `difficulty`, `multiturn`, read from the Parquet
  file its `prepare_data.py` writes (needs pyarrow) or from the same rows as JSON lines (`Dataset.to_json`).

Turns: the kit's benchmark is one greedy generation per prompt, so a prompt is the row's FIRST turn as one user
message. A later turn answers the model's own first reply, which a single generation never produces; later turns
are dropped and their number is recorded in the output's `source.later_turns_dropped`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftscope.core.datasets import provenance
from draftscope.core.errors import UserError
from draftscope.core.jsonio import dumps
from draftscope.core.outputs import check_output_path
from draftscope.core.reading import parse_json, read_bytes
from draftscope.core.schema import check

FORMATS = ("mt-bench", "spec-bench", "speed-bench")
# SPEED-Bench's published rows hold this text where a turn must be fetched from another dataset first.
SPEED_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise UserError(
            "unknown prompt-set format",
            field="--format",
            value=fmt,
            fix=f"choose one of: {', '.join(FORMATS)}",
        )
    return fmt


def convert(fmt: str, path: Path, *, name: str, description: str = "") -> dict[str, Any]:
    """The prompt file (a dict in the kit's prompts format) for the original file `path` in format `fmt`, with its
    `source`: format, file name, the original bytes' SHA-256, the turn mapping and the later turns dropped."""
    check_format(fmt)
    if not _ID.match(name):
        raise UserError(
            "not a prompt-set name",
            field="--name",
            value=name,
            fix="use lower-case letters, digits, '.', '_' and '-', starting with a letter or digit (at most 64)",
        )
    path = Path(path)
    raw = read_bytes(path)
    rows = (
        _parquet_rows(path)
        if fmt == "speed-bench" and path.suffix == ".parquet"
        else _jsonl_rows(raw, str(path))
    )
    prompts: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    dropped = 0
    for where, row in rows:
        prompt, later = _prompt(fmt, row, str(path), where)
        if prompt["id"] in seen:
            raise UserError(
                f"duplicate question_id: {prompt['id']!r} is also at {seen[prompt['id']]}",
                source=f"{path}: {where}",
                field="question_id",
                value=row.get("question_id"),
                fix="give every question a unique question_id",
            )
        seen[prompt["id"]] = where
        prompts.append(prompt)
        dropped += later
    if not prompts:
        raise UserError(
            "holds no questions", source=str(path), fix=f"give a {fmt} file with one question per line"
        )
    digest = hashlib.sha256(raw).hexdigest()
    source = {
        "format": fmt,
        **provenance(digest),  # repository, path, commit and licence of a known upstream file
        "file": path.name,
        "sha256": digest,
        "turns": "first",
        "later_turns_dropped": dropped,
    }
    doc: dict[str, Any] = {"schema_version": 1, "name": name}
    if description:
        doc["description"] = description
    doc["source"] = source
    doc["prompts"] = prompts
    return doc


def _jsonl_rows(raw: bytes, source: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if line.strip():
            yield f"line {number}", parse_json(line, source, expect=dict, line=number)


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq  # lazy: only SPEED-Bench's Parquet files need it
    except ImportError:
        raise UserError(
            "reading a Parquet file needs pyarrow, which is not installed here",
            source=str(path),
            fix="pip install pyarrow, or write the rows as JSON lines (datasets' Dataset.to_json) and import that",
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        raise UserError(
            f"not a readable Parquet file ({type(exc).__name__})",
            source=str(path),
            fix="give SPEED-Bench's test.parquet as prepare_data.py wrote it, or its rows as JSON lines",
        ) from None
    for index, row in enumerate(rows):
        yield f"row {index}", row


def _prompt(fmt: str, row: dict[str, Any], path: str, where: str) -> tuple[dict[str, Any], int]:
    """One question → (the kit's prompt, how many later turns were dropped)."""
    source = f"{path}: {where}"
    qid = row.get("question_id")
    if fmt == "speed-bench":
        if not isinstance(qid, str) or not qid:
            raise UserError(
                "expected a non-empty string",
                source=source,
                field="question_id",
                value=qid,
                fix="give each SPEED-Bench row its question_id (a string)",
            )
    elif isinstance(qid, bool) or not isinstance(qid, int) or qid < 0:
        raise UserError(
            "expected a non-negative integer",
            source=source,
            field="question_id",
            value=qid,
            fix=f"give each {fmt} question its integer question_id, as upstream's file does",
        )
    pid = _prompt_id(str(qid), source)
    category = row.get("category")
    if not isinstance(category, str) or not category.strip():
        raise UserError(
            "expected a non-empty string",
            source=source,
            field="category",
            value=category,
            fix="give each question its category",
        )
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise UserError(
            "expected a non-empty list of strings",
            source=source,
            field="turns",
            value=turns,
            fix="give each question its turns, the first being the prompt",
        )
    for i, turn in enumerate(turns):
        if not isinstance(turn, str):
            raise UserError(
                "expected a string",
                source=source,
                field=f"turns[{i}]",
                value=turn,
                fix="give every turn as text",
            )
        if not turn.strip():
            raise UserError(
                "empty turn",
                source=source,
                field=f"turns[{i}]",
                value=turn,
                fix="give every turn some text",
            )
        if turn.startswith(SPEED_PLACEHOLDER):
            raise UserError(
                "this turn is SPEED-Bench's placeholder, not a prompt: its text lives in another dataset",
                source=source,
                field=f"turns[{i}]",
                value=turn[:80],
                fix="resolve it first with specdec_bench's prepare_data.py (NVIDIA Model-Optimizer) and import "
                "the test.parquet it writes",
            )
    prompt = {"id": pid, "category": category, "messages": [{"role": "user", "content": turns[0]}]}
    return prompt, len(turns) - 1


def _prompt_id(qid: str, source: str) -> str:
    """The kit's prompt id for a question id: lower-case, any other character than [a-z0-9._-] as '-'."""
    pid = re.sub(r"[^a-z0-9._-]", "-", qid.lower())
    if not _ID.match(pid):
        raise UserError(
            "cannot be a prompt id: it must start with a letter or digit and have at most 64 characters",
            source=source,
            field="question_id",
            value=qid,
            fix="give the question a shorter id that starts with a letter or digit",
        )
    return pid


def write_new(doc: dict[str, Any], output: Path) -> None:
    """Write the converted prompt file to `output`, a new file: checked against the prompts schema first, and an
    existing file is never replaced."""
    check(doc, "prompts", str(output))
    output = check_output_path(output, "--output")
    try:
        with Path(output).open("x", encoding="utf-8") as fh:
            fh.write(dumps(doc))
    except FileExistsError:
        raise UserError(
            "the output file exists; it is never overwritten",
            field="--output",
            value=str(output),
            fix="give a new path, or remove the old file first",
        ) from None
    except FileNotFoundError:
        raise UserError(
            "the output's folder does not exist",
            field="--output",
            value=str(output),
            fix="create the folder first",
        ) from None
