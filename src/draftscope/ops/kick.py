"""`make kick-the-tires`: every claim a CPU can check, reproduced from pulled images, then a table of verdicts.

From published images when the lock names them (`repository@digest` for each image a CPU claim runs in): pulled by
digest into the engine at hand. Otherwise the kit publishes what it built here, as a maintainer would: the images go
to the loopback registry (images/local/registry.sh), their digests into a copy of the lock, and a second engine with
an empty storage — a reviewer's machine — pulls them by digest; every check then runs against that engine alone.
Claims that need a GPU, or that no command checks, get their verdict without running anything, and historical claims
stay labelled historical. Each check is `invoke claims.reproduce ID`, as a reviewer would type it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftscope.core import schema, settings
from draftscope.core.errors import UserError
from draftscope.core.images import LOCK_ENV, active_lock_path, load_lock, lock_entry, published_reference
from draftscope.core.jsonio import atomic_write_json
from draftscope.ops import claims as C
from draftscope.ops.engines import Engine, start_registry

NAMESPACE = "draftscope"


def cpu_claims(claims: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [c for c in claims if c["check"].get("hardware", {}).get("class") == "cpu"]


def needed_images(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({name for c in cpu_claims(claims) for name in c["check"]["images"]})


def _invoke(root: Path, env: Mapping[str, str], *args: str, log: Path) -> int:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ invoke {' '.join(args)}\n")
        out.flush()
        return subprocess.run(
            [sys.executable, "-m", "invoke", *args],
            cwd=root,
            env=settings.child_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode


def _step(root: Path, env: Mapping[str, str], log: Path, say: Callable[[str], None], *args: str) -> None:
    say(f"kick-the-tires: invoke {' '.join(args)}")
    if _invoke(root, env, *args, log=log) != 0:
        raise UserError(f"`invoke {' '.join(args[:2])}` failed", fix=f"see {log}")


def prepare(
    root: Path, work: Path, names: Sequence[str], say: Callable[[str], None]
) -> tuple[dict, Engine | None]:
    """The environment the checks run in (DOCKER_HOST, the lock), and the reviewer engine to stop afterwards."""
    log = work / "images.log"
    lock = load_lock()
    if all(published_reference(lock_entry(n, lock)) for n in names):
        say(f"kick-the-tires: the lock names published digests for {', '.join(names)}: pulling them")
        for name in names:
            _step(root, {}, log, say, "images.pull", name)
        return {}, None
    copy = work / "images.lock.json"
    shutil.copyfile(active_lock_path(), copy)
    address = start_registry(root)
    say(f"kick-the-tires: no published digests: publishing the images built here to {address}")
    for name in names:
        _step(
            root,
            {},
            log,
            say,
            "images.push",
            name,
            "--to",
            f"{address}/{NAMESPACE}/{name}",
            "--lock",
            str(copy),
        )
    reviewer = Engine(root, work / "reviewer").start()
    env = {**reviewer.env, LOCK_ENV: str(copy)}
    try:
        say("kick-the-tires: a second engine with an empty storage pulls them by digest")
        for name in names:
            _step(root, env, log, say, "images.pull", name)
    except BaseException:
        reviewer.stop()
        raise
    return env, reviewer


def kick(root: Path, verdicts: Path, say: Callable[[str], None] = print) -> tuple[list[dict[str, Any]], Path]:
    """Check every claim; (one row per claim, the folder of this kick)."""
    claims = C.load_claims(root)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = root / "runs" / "kick-the-tires" / stamp
    work.mkdir(parents=True)
    started = time.monotonic()
    env, reviewer = prepare(root, work, needed_images(claims), say)
    rows = []
    try:
        for claim in claims:
            begun = time.monotonic()
            code = _invoke(
                root,
                env,
                "claims.reproduce",
                claim["id"],
                "--verdicts",
                str(verdicts),
                log=work / "claims.log",
            )
            verdict = C.latest(verdicts, claim["id"])
            rows.append(_row(claim, verdict, code, time.monotonic() - begun))
            say(f"kick-the-tires: {claim['id']}: {rows[-1]['verdict']} ({rows[-1]['seconds']:.0f} s)")
    finally:
        if reviewer is not None:
            reviewer.stop()
    write_summary(work, stamp, time.monotonic() - started, rows)
    return rows, work


def write_summary(work: Path, stamp: str, seconds: float, rows: Sequence[Mapping[str, Any]]) -> Path:
    """kick.json, checked against its schema, written whole or not at all (a kill mid-write leaves no torn file)."""
    summary = {
        "schema_version": 1,
        "kind": "kick-the-tires",
        "started": stamp,
        "seconds": round(seconds, 1),
        "claims": list(rows),
    }
    path = work / "kick.json"
    schema.check(summary, "kick", str(path))
    atomic_write_json(path, summary)
    return path


def _row(claim: Mapping[str, Any], verdict: Mapping[str, Any] | None, code: int, seconds: float) -> dict:
    check = claim["check"]
    return {
        "claim": claim["id"],
        "origin": claim["origin"],
        "hardware": check["hardware"]["description"] if "hardware" in check else "-",
        "verdict": verdict["verdict"] if verdict else "failed",
        "shown": C.label(claim, verdict) if verdict else f"failed (claims.reproduce exited with {code})",
        "reason": verdict["reason"] if verdict else "",
        "seconds": round(seconds, 1),
        "expected_minutes": check.get("minutes"),
    }


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The verdicts as text lines: one per claim, then the tally."""
    width = max(len(r["claim"]) for r in rows)
    lines = [f"{'claim':<{width}}  {'time':>6}  verdict", f"{'-' * width}  {'-' * 6}  {'-' * 7}"]
    for r in rows:
        lines.append(f"{r['claim']:<{width}}  {r['seconds']:>5.0f}s  {r['shown']}")
    tally: dict[str, int] = {}
    for r in rows:
        tally[r["verdict"]] = tally.get(r["verdict"], 0) + 1
    lines.append("; ".join(f"{n} {v.replace('_', ' ')}" for v, n in sorted(tally.items())))
    return lines
