"""pretokenize in the container: chat rows → `{id, input_ids, loss_mask}` lines and their statistics.

The loss mask covers the final assistant reply: the tokens after the last `<|im_start|>` and its role line
(`assistant\\n`), up to and including the reply's `<|im_end|>` — what the target generates, nothing of the prompt
and not the template's trailing newline. The chat template's output is read by attribute (`.input_ids`):
`BatchEncoding` stopped passing `isinstance(x, dict)` in a transformers upgrade (docs/develop/integration-bugs.md, bug 3).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import JsonlAppender, atomic_write_json, iter_jsonl
from draftscope.core.schema import check

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ASSISTANT = "assistant"


@dataclass
class Stats:
    input_rows: int = 0
    too_long: int = 0
    no_assistant_reply: int = 0
    too_few_loss_tokens: int = 0
    truncated: int = 0
    lengths: list[int] = field(default_factory=list)
    loss_tokens: int = 0


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a whole conversation through the tokenizer's own chat template.

    `apply_chat_template(..., return_dict=True)` returns a `BatchEncoding`; its ids are read as an attribute, which
    works whether or not that class passes `isinstance(x, dict)` in the installed transformers (docs/develop/integration-bugs.md, bug 3). A plain
    list (older return form) is accepted as is.
    """
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True)
    ids = getattr(out, "input_ids", out)
    if ids and isinstance(ids[0], list):  # a batch of one
        (ids,) = ids
    return [int(i) for i in ids]


def assistant_mask(tokenizer: Any, ids: Sequence[int]) -> list[int] | None:
    """1 on the final assistant reply (after the last `<|im_start|>` and its role line, through `<|im_end|>`).

    None when the conversation does not end with an assistant turn."""
    start_id = tokenizer.convert_tokens_to_ids(IM_START)
    end_id = tokenizer.convert_tokens_to_ids(IM_END)
    starts = [i for i, t in enumerate(ids) if t == start_id]
    if not starts:
        return None
    start = starts[-1]
    # The role line: tokens up to and including the first one whose text holds the newline.
    newline = None
    for j in range(start + 1, len(ids)):
        if "\n" in tokenizer.decode([ids[j]]):
            newline = j
            break
    if newline is None:
        return None
    role = tokenizer.decode(list(ids[start + 1 : newline + 1])).strip()
    if role != ASSISTANT:
        return None
    ends = [i for i in range(newline + 1, len(ids)) if ids[i] == end_id]
    stop = ends[-1] + 1 if ends else len(ids)
    return [1 if newline < i < stop else 0 for i in range(len(ids))]


def tokenize_row(
    tokenizer: Any, row: dict[str, Any], *, max_length: int, overlong: str, min_loss_tokens: int, stats: Stats
) -> dict[str, Any] | None:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages or messages[-1].get("role") != ASSISTANT:
        stats.no_assistant_reply += 1
        return None
    ids = encode_chat(tokenizer, messages)
    mask = assistant_mask(tokenizer, ids)
    if mask is None:
        stats.no_assistant_reply += 1
        return None
    if len(ids) > max_length:
        if overlong == "drop":
            stats.too_long += 1
            return None
        ids, mask = ids[:max_length], mask[:max_length]
        stats.truncated += 1
    if sum(mask) < min_loss_tokens:
        stats.too_few_loss_tokens += 1
        return None
    stats.lengths.append(len(ids))
    stats.loss_tokens += sum(mask)
    return {"id": str(row["id"]), "input_ids": ids, "loss_mask": mask}


def read_rows(path: Path, max_rows: int | None) -> Iterator[dict[str, Any]]:
    seen: set[str] = set()
    for number, row in iter_jsonl(path):
        if not isinstance(row, dict) or "id" not in row:
            raise UserError(f"line {number} is not a chat row with an 'id'", source=str(path))
        if str(row["id"]) in seen:
            raise UserError(f"line {number}: duplicate row id {row['id']!r}", source=str(path))
        seen.add(str(row["id"]))
        yield row
        if max_rows is not None and len(seen) >= max_rows:
            return


def summarize(
    stats: Stats, *, rows: int, max_length: int, tokenizer_path: str, template: str
) -> dict[str, Any]:
    tokens = sum(stats.lengths)
    length = (
        {
            "median": float(statistics.median(stats.lengths)),
            "min": min(stats.lengths),
            "max": max(stats.lengths),
            "n": len(stats.lengths),
        }
        if stats.lengths
        else None
    )
    return {
        "schema_version": 1,
        "input_rows": stats.input_rows,
        "rows": rows,
        "dropped": {
            "too_long": stats.too_long,
            "no_assistant_reply": stats.no_assistant_reply,
            "too_few_loss_tokens": stats.too_few_loss_tokens,
        },
        "truncated": stats.truncated,
        "tokens": tokens,
        "loss_tokens": stats.loss_tokens,
        "masked_fraction": (stats.loss_tokens / tokens) if tokens else 0.0,
        "max_length": max_length,
        "length": length,
        "tokenizer": tokenizer_path,
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
    }


def pretokenize(
    tokenizer: Any,
    rows: Iterable[dict[str, Any]],
    output: Path,
    *,
    max_length: int,
    overlong: str = "truncate",
    min_loss_tokens: int = 1,
    tokenizer_path: str = "",
) -> dict[str, Any]:
    """Write one `{id, input_ids, loss_mask}` line per kept row; return the statistics (schema-shaped)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise UserError(
            "the tokenizer has no chat template", source=tokenizer_path, fix="use the target's tokenizer"
        )
    stats = Stats()
    kept = 0
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.unlink(missing_ok=True)
    with JsonlAppender(partial) as out:
        for row in rows:
            stats.input_rows += 1
            result = tokenize_row(
                tokenizer,
                row,
                max_length=max_length,
                overlong=overlong,
                min_loss_tokens=min_loss_tokens,
                stats=stats,
            )
            if result is not None:
                out.append(result)
                kept += 1
    partial.replace(output)  # the rows file appears whole or not at all
    return summarize(
        stats, rows=kept, max_length=max_length, tokenizer_path=tokenizer_path, template=template
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--stats", required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--overlong", choices=["truncate", "drop"], default="truncate")
    parser.add_argument("--min-loss-tokens", type=int, default=1)
    parser.add_argument("--max-rows", type=int, default=None)


def main(args: argparse.Namespace) -> dict[str, Any]:
    """In the train image (or --runtime local): load the tokenizer offline, tokenize, write rows and stats."""
    # lazy: transformers, in the train image only
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependency(exc.name or "transformers", extra="local", image="train") from None
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    stats = pretokenize(
        tokenizer,
        read_rows(Path(args.input), args.max_rows),
        Path(args.output),
        max_length=args.max_length,
        overlong=args.overlong,
        min_loss_tokens=args.min_loss_tokens,
        tokenizer_path=args.tokenizer,
    )
    check(stats, "stage-pretokenize", args.stats)
    atomic_write_json(Path(args.stats), stats)
    if stats["rows"] == 0:
        raise UserError(
            "no row survived pretokenization", source=args.input, fix="see the dropped counts in stats.json"
        )
    return {
        "input_rows": stats["input_rows"],
        "rows": stats["rows"],
        "tokens": stats["tokens"],
        "loss_tokens": stats["loss_tokens"],
    }
