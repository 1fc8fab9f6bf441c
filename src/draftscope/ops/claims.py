"""One command per claim: `invoke claims.reproduce ID` runs the commands research/claims.yaml names for a claim, in
the pinned images, reads each figure from their outputs, compares it with the claim's and writes a schema-valid
verdict (runs/claims/ID/STAMP/verdict.json, beside the commands' outputs and logs); `invoke claims` lists every claim
with its last verdict.

A claim whose hardware this machine lacks is not run: its verdict says what it needs. A command that fails, or an
output without the figure, makes the verdict `failed` — nothing is known about the claim then, which is not the same
as `not_reproduced`, where the commands ran and a figure came out outside its tolerance (both figures are kept).
Historical claims (the original authors' figures) keep that label in every listing, whatever a run here gives.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftscope.core import schema
from draftscope.core.config import load_yaml
from draftscope.core.errors import UserError
from draftscope.core.hardware import gpus_from_nvidia_smi
from draftscope.core.images import active_lock_path, load_lock, lock_entry, published_reference
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.provenance import kit_info, now

CLAIMS_FILE = Path("research") / "claims.yaml"
VERDICTS_DIR = Path("runs") / "claims"
VERDICT = "verdict.json"
REDUCERS: dict[str, Callable[[list[Any]], Any]] = {
    "all": lambda v: all(x is True for x in v),
    "any": lambda v: any(x is True for x in v),
    "count": len,
    "min": min,
    "max": max,
    "sum": sum,
    "median": statistics.median,
}


def load_claims(root: Path) -> list[dict[str, Any]]:
    """research/claims.yaml, validated (schemas/claims.schema.json)."""
    data = load_yaml(root / CLAIMS_FILE, expect=dict)
    schema.check(data, "claims", str(CLAIMS_FILE))
    for i, claim in enumerate(data["claims"]):
        _check_shape(claim["check"], f"$.claims[{i}].check")
    return data["claims"]


FULL_CHECK = ("hardware", "images", "minutes", "commands", "figures")


def _check_shape(check: Mapping[str, Any], where: str) -> None:
    """What the schema leaves to code: `none` alone, or every part of a check; `invoke` commands; a GPU named."""
    if "none" in check:
        if len(check) != 1:
            raise UserError(
                "a check that says why nothing checks the claim has nothing else",
                field=f"{where}.none",
                fix=f"remove {', '.join(sorted(set(check) - {'none'}))} or the `none`",
            )
        return
    missing = [key for key in FULL_CHECK if key not in check]
    if missing:
        raise UserError(
            f"a check needs {', '.join(FULL_CHECK)}",
            field=f"{where}.{missing[0]}",
            fix="add it, or say `none: why`",
        )
    for j, command in enumerate(check["commands"]):
        if command[0] != "invoke":
            raise UserError(
                "a check's command is a kit task",
                field=f"{where}.commands[{j}][0]",
                value=command[0],
                fix="start it with invoke",
            )
    _check_together(check, where)
    if check["hardware"]["class"] == "gpu" and not check["hardware"].get("gpu"):
        raise UserError(
            "a GPU check names its GPU", field=f"{where}.hardware.gpu", fix="e.g. gpu: A100-SXM4-80GB"
        )


def _check_together(check: Mapping[str, Any], where: str) -> None:
    """`together` groups are runs of consecutive command numbers (from 1), each command in one group at most."""
    count, seen = len(check["commands"]), set()
    for g, group in enumerate(check.get("together", [])):
        if sorted(group) != list(range(min(group), min(group) + len(group))) or max(group) > count:
            raise UserError(
                f"a group started together is consecutive command numbers, from 1 to {count}",
                field=f"{where}.together[{g}]",
                value=group,
                fix="e.g. [1, 2] for the first two commands",
            )
        if seen & set(group):
            raise UserError("a command is in one group at most", field=f"{where}.together[{g}]", value=group)
        seen |= set(group)


def steps(check: Mapping[str, Any]) -> list[list[list[str]]]:
    """A check's commands as steps run one after the other; a step is one command, or a `together` group started
    at once (an A/A pair that must see the same machine load, as its study ran it)."""
    first = {min(group): len(group) for group in check.get("together", [])}
    commands, out, n = check.get("commands", []), [], 0
    while n < len(commands):
        size = first.get(n + 1, 1)
        out.append([list(c) for c in commands[n : n + size]])
        n += size
    return out


def argvs(check: Mapping[str, Any]) -> list[list[str]]:
    """Every command of a check, in order."""
    return [command for step in steps(check) for command in step]


def find_claim(claims: Sequence[Mapping[str, Any]], claim_id: str) -> Mapping[str, Any]:
    for claim in claims:
        if claim["id"] == claim_id:
            return claim
    raise UserError(
        "no such claim in research/claims.yaml",
        field="claim",
        value=claim_id,
        fix="`invoke claims` lists them: " + ", ".join(c["id"] for c in claims),
    )


def hardware_needed(check: Mapping[str, Any]) -> str:
    return check["hardware"]["description"] if "hardware" in check else "no command checks it"


def hardware_found(
    check: Mapping[str, Any], gpus: Callable[[], list[Any] | None] = gpus_from_nvidia_smi
) -> str | None:
    """What on this machine meets the claim's hardware (a description), or None where nothing does."""
    import platform

    if check["hardware"]["class"] == "cpu":
        return f"{platform.machine()} CPU"
    wanted = check["hardware"]["gpu"]
    names = [gpu.name for gpu in gpus() or []]
    return next((name for name in names if wanted.lower() in name.lower()), None)


def _values(doc: Any, keys: list[str]) -> list[Any]:
    """Every value at the dotted keys; `*` stands for each item of a list or each value of a mapping."""
    if not keys:
        return [doc]
    key, rest = keys[0], keys[1:]
    if key == "*" and isinstance(doc, dict | list):
        items = doc.values() if isinstance(doc, dict) else doc
        return [value for item in items for value in _values(item, rest)]
    if isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
        return _values(doc[int(key)], rest)
    if isinstance(doc, dict) and key in doc:
        return _values(doc[key], rest)
    raise KeyError(key)


def measure(figure: Mapping[str, Any], work: Path) -> tuple[Any, str | None]:
    """(the figure's value as the outputs give it, a problem or None). A JSON-lines file, or a `*` in the path,
    gives several values, which the figure's `reduce` makes one."""
    path, keys = Path(figure["file"].replace("{work}", str(work))), figure["path"].split(".")
    if not path.is_file():
        return None, f"{figure['file']} was not written"
    try:
        if path.suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            values = [v for line in lines if line.strip() for v in _values(json.loads(line), keys)]
            many = True
        else:
            values, many = _values(read_json(path), keys), "*" in keys
    except KeyError as missing:
        return None, f"{figure['file']} has no {figure['path']} (at {missing})"
    except (UserError, ValueError) as exc:
        return None, f"{figure['file']}: {exc}"
    if not many:
        return values[0], None
    if "reduce" not in figure:
        return None, f"{figure['file']} {figure['path']} gives several values: the figure needs a `reduce`"
    if not values:
        return None, f"{figure['file']} has no value at {figure['path']}"
    try:
        return REDUCERS[figure["reduce"]](values), None
    except (TypeError, statistics.StatisticsError) as exc:
        return None, f"{figure['file']} {figure['path']}: cannot take the {figure['reduce']}: {exc}"


def judge(figure: Mapping[str, Any], measured: Any) -> bool:
    expected = figure["expected"]
    if isinstance(expected, bool | str):
        return measured == expected
    if isinstance(measured, bool) or not isinstance(measured, int | float):
        return False
    relation, tolerance = figure.get("relation", "within"), figure.get("tolerance", 0)
    if relation == "at_most":
        return measured <= expected + tolerance
    if relation == "at_least":
        return measured >= expected - tolerance
    return abs(measured - expected) <= tolerance


def figure_rows(check: Mapping[str, Any], work: Path) -> list[dict[str, Any]]:
    rows = []
    for figure in check["figures"]:
        measured, problem = measure(figure, work)
        expected = figure["expected"]
        numeric = isinstance(expected, int | float) and not isinstance(expected, bool)
        row = {
            "quantity": figure["quantity"],
            "expected": expected,
            "measured": measured if isinstance(measured, str | int | float | bool) else None,
            "ok": problem is None and judge(figure, measured),
        }
        if numeric:
            row.update(tolerance=figure.get("tolerance", 0), relation=figure.get("relation", "within"))
        else:
            row["relation"] = "equal"
        if problem:
            row["problem"] = problem
        rows.append(row)
    return rows


@dataclass
class Context:
    """Where a check runs: the checkout, the verdicts' folder, how commands and image look-ups are made."""

    root: Path
    verdicts: Path
    python: str = sys.executable
    image_facts: Callable[[str], dict[str, Any]] | None = None
    gpus: Callable[[], list[Any] | None] = gpus_from_nvidia_smi
    say: Callable[[str], None] = print


def _argv(command: Sequence[str], work: Path, python: str) -> list[str]:
    words = [w.replace("{work}", str(work)) for w in command]
    return [python, "-m", "invoke", *words[1:]]


def _images(check: Mapping[str, Any], ctx: Context) -> tuple[list[dict[str, Any]], str | None]:
    rows, lock = [], load_lock()
    for name in check["images"]:
        entry = lock_entry(name, lock)
        try:
            facts = (
                ctx.image_facts(name) if ctx.image_facts else {"reference": entry["reference"], "id": None}
            )
        except UserError as exc:
            return rows, f"image {name}: {exc.message} ({exc.fix})" if exc.fix else exc.message
        rows.append(
            {
                "name": name,
                "reference": facts.get("reference") or entry["reference"],
                "id": facts.get("id"),
                "repo_digests": list(facts.get("repo_digests") or []),
                "published": published_reference(entry),
            }
        )
    return rows, None


def new_work(verdicts: Path, claim_id: str) -> Path:
    """A fresh folder for one check (never an existing one: an earlier verdict is never overwritten)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = verdicts / claim_id
    for n in range(1000):
        work = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            work.mkdir(parents=True)
            return work
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(
                f"cannot create the verdict's folder: {exc.strerror or exc}",
                field="--verdicts",
                value=str(verdicts),
                fix="pass a folder you may write in (default runs/claims)",
            ) from None
    raise UserError(f"no free folder under {base}", field="--output")


def reproduce(claim: Mapping[str, Any], ctx: Context) -> tuple[dict[str, Any], Path]:
    """Check one claim; its verdict document and where it was written."""
    check, started, clock = claim["check"], now(), time.monotonic()
    work = new_work(ctx.verdicts, claim["id"])
    doc: dict[str, Any] = {
        "schema_version": 1,
        "kind": "claim-verdict",
        "claim": claim["id"],
        "origin": claim["origin"],
        "hardware": {"needed": hardware_needed(check), "found": "-"},
        "figures": [],
        "commands": [],
        "images": [],
        "lock": _shown(active_lock_path(), ctx.root),
        "started_at": started,
        "expected_minutes": check.get("minutes", 0.01),
        "kit": kit_info(),
    }
    if "none" in check:
        doc["hardware"]["found"] = "-"
        return _finish(doc, work, clock, "not_checkable", " ".join(check["none"].split()))
    found = hardware_found(check, ctx.gpus)
    if found is None:
        doc["hardware"]["found"] = "none of it on this machine"
        return _finish(doc, work, clock, "needs_hardware", f"needs {hardware_needed(check)}")
    doc["hardware"]["found"] = found
    doc["images"], missing = _images(check, ctx)
    if missing:
        return _finish(doc, work, clock, "failed", missing)
    for step in steps(check):
        failure = _run_step(step, doc["commands"], work, ctx, claim["id"])
        if failure:
            return _finish(doc, work, clock, "failed", failure)
    doc["figures"] = figure_rows(check, work)
    broken = [row for row in doc["figures"] if "problem" in row]
    if broken:
        return _finish(doc, work, clock, "failed", broken[0]["problem"])
    off = [row for row in doc["figures"] if not row["ok"]]
    if off:
        shown = "; ".join(f"{r['quantity']}: {r['measured']} against {r['expected']}" for r in off)
        return _finish(doc, work, clock, "not_reproduced", shown)
    return _finish(doc, work, clock, "reproduced", f"{len(doc['figures'])} figure(s) as claimed")


def _run_step(
    step: Sequence[Sequence[str]], rows: list[dict[str, Any]], work: Path, ctx: Context, claim_id: str
) -> str | None:
    """Start every command of a step at once (one, usually), wait for all, add their rows; why one failed, or None."""
    running = []
    for command in step:
        log = work / "logs" / f"{len(rows) + len(running) + 1:02d}-{command[1]}.log"
        log.parent.mkdir(exist_ok=True)
        ctx.say(f"{claim_id}: {' '.join(command)}" + (" (started together)" if len(step) > 1 else ""))
        with log.open("w", encoding="utf-8") as out:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                _argv(command, work, ctx.python), cwd=ctx.root, stdout=out, stderr=subprocess.STDOUT
            )
        running.append((command, log, process, time.monotonic()))
    failure = None
    for command, log, process, begun in running:
        code = process.wait()
        seconds = round(time.monotonic() - begun, 3)
        rows.append({"argv": list(command), "exit_code": code, "seconds": seconds, "log": _shown(log, work)})
        if code != 0 and failure is None:
            lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["(no output)"]
            failure = f"`{' '.join(command[:2])}` exited with {code}: {lines[-1]}"
    return failure


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def _finish(doc: dict[str, Any], work: Path, clock: float, verdict: str, reason: str) -> tuple[dict, Path]:
    doc.update(verdict=verdict, reason=reason, finished_at=now(), seconds=round(time.monotonic() - clock, 3))
    schema.check(doc, "claim-verdict", VERDICT)
    path = work / VERDICT
    atomic_write_json(path, doc)
    return doc, path


def latest(verdicts: Path, claim_id: str) -> dict[str, Any] | None:
    """The newest readable verdict of a claim (folders are named by their UTC start, so they sort in time)."""
    for path in sorted((verdicts / claim_id).glob(f"*/{VERDICT}"), reverse=True):
        try:
            doc = read_json(path, expect=dict)
        except UserError:
            continue
        if not schema.problems(doc, "claim-verdict"):
            return doc
    return None


def label(claim: Mapping[str, Any], verdict: Mapping[str, Any] | None) -> str:
    """The verdict as a table shows it; a historical claim stays labelled historical."""
    if verdict is None:
        shown = "not checked here"
    elif verdict["verdict"] in ("needs_hardware", "not_checkable"):
        shown = verdict["reason"] if verdict["verdict"] == "needs_hardware" else "no command checks it"
    else:
        shown = verdict["verdict"].replace("_", " ")
    if claim["origin"] == "historical":
        shown += f" (historical, reported by {claim['provenance']['reported_by']})"
    return shown
