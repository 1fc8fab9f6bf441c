"""Records → summary: medians with min/max per prompt and overall, counts, greedy agreement, and the acceptance
ledger (core/acceptance.py: pooled, per-request and token-weighted mean acceptance length, rate, per position).

Host-side and dependency-free (statistics.median), so a partial run is summarised the same way as a complete one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from draftscope.core import acceptance
from draftscope.core.jsonio import iter_jsonl
from draftscope.core.layout import RECORDS


def stat(values: Iterable[float | int | None]) -> dict[str, float] | None:
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present), "n": len(present)}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None when identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = {
        "request_tok_s": stat(r.get("request_tok_s") for r in records),
        "decode_tok_s": stat(r.get("decode_tok_s") for r in records),
        "request_seconds": stat(r.get("request_seconds") for r in records),
        "generated_tokens": stat(r.get("generated_tokens") for r in records),
    }
    lengths = [n for r in records for n in (r.get("acceptance_lengths") or [])]
    if lengths:
        out["acceptance_length"] = stat(lengths)  # kept for compatibility: the median of whole numbers
    ledger = acceptance.from_records(records)
    if ledger is not None:
        # Accepted drafts over proposed drafts (core/acceptance.py), the same figure as acceptance.rate.
        out["acceptance_rate"] = ledger["rate"]
        out["acceptance"] = ledger
    return out


def summarize(
    run_id: str, records: Sequence[Mapping[str, Any]], prompt_ids: Sequence[str], *, partial: bool
) -> dict:
    by_prompt: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    disagreements = []
    for pid, rows in by_prompt.items():
        reference = min(rows, key=lambda r: r["repeat"])
        for r in sorted(rows, key=lambda r: r["repeat"]):
            pos = first_divergence(reference["generated_token_ids"], r["generated_token_ids"])
            if pos is not None:
                disagreements.append(
                    {"prompt_id": pid, "repeat": r["repeat"], "first_diverging_position": pos}
                )
    return {
        "schema_version": 1,
        "run_id": run_id,
        "partial": partial,
        "records": len(records),
        "prompts_total": len(prompt_ids),
        "prompts_completed": sum(1 for pid in prompt_ids if pid in by_prompt),
        "greedy_agreement": not disagreements,
        "disagreements": disagreements,
        "quality_accepted": None,
        "overall": _stats(records),
        "per_prompt": {pid: _stats(rows) for pid, rows in by_prompt.items()},
        **({"head": head} if (head := head_totals(records)) else {}),
    }


def head_totals(records: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """The certified head's counters summed over the records (None when the run used no certified head)."""
    totals: dict[str, int] = {}
    for r in records:
        for name, value in ((r.get("extra") or {}).get("head") or {}).items():
            totals[name] = totals.get(name, 0) + int(value)
    return totals or None


def read_records(run_dir) -> list[dict[str, Any]]:
    path = run_dir / RECORDS
    return [obj for _, obj in iter_jsonl(path)] if path.exists() else []
