"""A summary that cannot disagree with its records: the records' hash and every figure, recomputed.

When a run's summary.json is written (RunDir.write_summary) it records `records_sha256`: the SHA-256 of the run's
records.jsonl exactly as on disk at that moment, bytes as written, torn last line included (one file per run, so
the hash is of that file alone). `invoke validate` and `analyze`/`compare` (analysis/load.py) then

1. hash records.jsonl again: a different hash means a record changed after the run (`records_sha256`);
2. summarize the records again (core/summary.py, with the prompt ids of the run's own prompts copy; `partial`, the
   one field the records cannot tell, follows from the manifest's final status: partial unless completed) and compare every field of the stored summary with the
   recomputed one, naming the first path that differs, the stored value and the recomputed one.

Counts, ids, booleans and strings must be equal. Floats (medians, rates, means) must agree to a relative 1e-9:
the summary is the same arithmetic on the same records, and JSON keeps a float exactly, so the tolerance only
absorbs a formatter that wrote fewer digits; a real change (a median tripled, a record 5x slower) is far outside it.

A summary written before `records_sha256` existed has none: every figure it holds is still recomputed and must
agree (a figure the kit added since, such as the acceptance ledger, is absent from it and not a difference), and
the missing hash is reported as a warning (`MISSING_HASH`), never silently passed. Readers (analysis/load.py) use
the recomputed summary once it agrees, so `analyze` and `compare` show the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftscope.core.datasets import selected
from draftscope.core.jsonio import read_json, sha256_file
from draftscope.core.layout import MANIFEST, RECORDS
from draftscope.core.summary import summarize
from draftscope.core.untrusted import check_file

REL_TOL = 1e-9
MISSING_HASH = (
    "records_sha256: missing (written before the kit recorded it): the figures were recomputed from the records "
    "and agree, but an edited record cannot be told from the original"
)


def records_sha256(run_dir: Path) -> str | None:
    path = Path(run_dir) / RECORDS
    return sha256_file(path) if path.is_file() else None


def hash_problem(run_dir: Path, summary: Mapping[str, Any]) -> str | None:
    """Why the stored records hash fails (None when it matches; a missing one is `missing_hash`'s business)."""
    stored = summary.get("records_sha256")
    if stored is None:
        return None
    actual = records_sha256(run_dir)
    if actual is None:
        return f"$.records_sha256: {stored} was recorded, but {RECORDS} is missing"
    if actual != stored:
        return (
            f"$.records_sha256: {RECORDS} has SHA-256 {actual}, not the {stored} recorded when the summary was "
            "written (a record was edited after the run)"
        )
    return None


def prompt_ids(run_dir: Path) -> list[str] | None:
    """The ids of the prompts the run used, from its own prompts copy (inputs/NAME), the first `max_prompts` of them
    where its config sets one (`core.datasets.selected`, as the supervisor summarized them); None when the run
    records no prompts input or its copy cannot be read (the manifest check reports that)."""
    try:
        manifest = read_json(Path(run_dir) / MANIFEST, expect=dict)
        entries = [i for i in manifest.get("inputs", []) if i.get("name") == "prompts"]
        if not entries:
            return None
        name = Path(entries[0]["path"]).name
        check_file(
            Path(run_dir), f"inputs/{name}"
        )  # a regular file inside the run: never a pipe or a link out
        copy = Path(run_dir) / "inputs" / name
        if sha256_file(copy) != entries[0].get("sha256"):
            return None  # an edited copy says nothing of the run; the manifest check and `reproduce` name it
        prompts = read_json(copy, expect=dict)["prompts"]
        return [p["id"] for p in selected(prompts, (manifest.get("config") or {}).get("max_prompts"))]
    except Exception:  # any unreadable copy: the figures that need it are not compared
        return None


def recompute(
    summary: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    ids: Sequence[str] | None,
    partial: bool | None = None,
) -> dict[str, Any]:
    """The summary these records give. Without the prompt ids, prompts_total and prompts_completed are taken as
    stored (they cannot be recomputed); `partial` is what the run's final status implies (None: as stored)."""
    known = list(ids) if ids is not None else list(dict.fromkeys(r["prompt_id"] for r in records))
    partial = bool(summary.get("partial")) if partial is None else partial
    again = summarize(str(summary.get("run_id")), records, known, partial=partial)
    if "partial" not in summary:
        again.pop("partial")
    if ids is None:
        for name in ("prompts_total", "prompts_completed"):
            again[name] = summary.get(name)
    if "records_sha256" in summary:
        again["records_sha256"] = summary["records_sha256"]  # checked against the file by `hash_problem`
    return again


def figure_problem(
    summary: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    ids: Sequence[str] | None,
    partial: bool | None = None,
) -> str | None:
    """The first field where the stored summary differs from the one its records give, or None."""
    older = "records_sha256" not in summary  # written by an earlier kit: it may lack a figure added since
    found = first_difference(summary, recompute(summary, records, ids, partial), "$", older=older)
    if found is None:
        return None
    where, stored, again = found
    return (
        f"{where}: the summary says {_show(stored)} but its records give {_show(again)} "
        "(the summary does not follow from records.jsonl)"
    )


def problems(
    run_dir: Path,
    summary: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    partial: bool | None = None,
) -> list[str]:
    """Every integrity problem of a schema-valid summary against its run's records (hash first). `partial`: what
    the run's final status says (a summary is partial exactly when its run did not complete)."""
    found = [
        p
        for p in (
            hash_problem(run_dir, summary),
            figure_problem(summary, records, prompt_ids(run_dir), partial),
        )
        if p
    ]
    return found


def first_difference(
    stored: Any, again: Any, where: str, *, older: bool = False
) -> tuple[str, Any, Any] | None:
    """(path, stored, recomputed) of the first difference, keys in sorted order; None when they agree. `older`:
    a key only the recomputed summary has is a figure added to the kit since the summary was written, not a
    difference (a key only the stored summary has always is)."""
    if isinstance(stored, Mapping) and isinstance(again, Mapping):
        for key in sorted(set(stored) | set(again), key=str):
            if older and key not in stored:
                continue
            if key not in stored or key not in again:
                return f"{where}.{key}", stored.get(key, _ABSENT), again.get(key, _ABSENT)
            found = first_difference(stored[key], again[key], f"{where}.{key}", older=older)
            if found:
                return found
        return None
    if isinstance(stored, list) and isinstance(again, list):
        if len(stored) != len(again):
            return f"{where}", f"{len(stored)} item(s)", f"{len(again)} item(s)"
        for i, (a, b) in enumerate(zip(stored, again, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]", older=older)
            if found:
                return found
        return None
    return None if _same(stored, again) else (where, stored, again)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or (type(a) is type(b) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    return type(a) is type(b) and a == b


class _Absent:
    def __repr__(self) -> str:
        return "absent"


_ABSENT = _Absent()


def _show(value: Any) -> str:
    return "absent" if value is _ABSENT else repr(value)
