"""Stage state: fingerprints of what a stage read and wrote, and its schema-validated completion record.

A record (`stages/<stage>.json`, schema `stage-record`) holds the SHA-256 of every input, the exact command and the
processes it started, the image, versions, counts and duration. A rerun skips a stage whose record is `completed`
with the same config fingerprint (argv, commands, image) and the same input fingerprints, and whose outputs are
still there; `--force` reruns it.

Fingerprints: a file is hashed whole. A folder (a dataset, hidden states, checkpoints) is a "tree stamp": the
SHA-256 over its files' relative paths and sizes, with the content hash of every file up to 16 MiB — exact for
configs and indexes, cheap for terabytes of hidden states (whose files are written once and never edited in place).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from draftscope.core.jsonio import atomic_write_json, read_json, sha256_file
from draftscope.core.schema import check, problems
from draftscope.pipeline.base import STAGES_DIR, Artifact

SMALL_FILE = 16 * 1024 * 1024
RECORD_SCHEMA = "stage-record"


def tree_stamp(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".partial")):
        rel = path.relative_to(folder).as_posix()
        size = path.stat().st_size
        content = sha256_file(path) if size <= SMALL_FILE else "-"
        digest.update(f"{rel}\0{size}\0{content}\n".encode())
    return digest.hexdigest()


def fingerprint(artifact: Artifact) -> dict[str, Any] | None:
    """{name, path, sha256, kind}, or None when an optional artifact is absent."""
    path = artifact.path
    if artifact.kind == "tree" and path.is_dir():
        sha = tree_stamp(path)
    elif artifact.kind == "file" and path.is_file():
        sha = sha256_file(path)
    elif not artifact.required:
        return None
    else:
        return {"name": artifact.name, "path": str(path), "sha256": None, "kind": artifact.kind}
    return {"name": artifact.name, "path": str(path), "sha256": sha, "kind": artifact.kind}


def fingerprints(artifacts: Iterable[Artifact]) -> list[dict[str, Any]]:
    return [f for f in (fingerprint(a) for a in artifacts) if f is not None]


def missing(artifacts: Iterable[Artifact]) -> list[Artifact]:
    """Required artifacts that are not on disk."""
    return [
        a for a in artifacts if a.required and not (a.path.is_dir() if a.kind == "tree" else a.path.is_file())
    ]


def config_sha256(argv: Sequence[str], commands: Sequence[Mapping[str, Any]], image: str | None) -> str:
    """What the stage will run: its container argv, the processes that argv starts, and the image."""
    blob = json.dumps({"argv": list(argv), "commands": list(commands), "image": image}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def record_path(workdir: Path, stage: str) -> Path:
    return workdir / STAGES_DIR / f"{stage}.json"


def read_record(workdir: Path, stage: str) -> dict[str, Any] | None:
    """The stage's record if present and schema-valid; an invalid one counts as absent (the stage reruns)."""
    path = record_path(workdir, stage)
    if not path.is_file():
        return None
    try:
        record = read_json(path)
    except Exception:  # a torn or hand-edited record: rerun rather than trust it
        return None
    return record if not problems(record, RECORD_SCHEMA) else None


def write_record(workdir: Path, record: Mapping[str, Any]) -> Path:
    path = record_path(workdir, record["stage"])
    check(dict(record), RECORD_SCHEMA, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, dict(record))
    return path


def skip_reason(
    record: Mapping[str, Any] | None,
    *,
    config_hash: str,
    inputs: Sequence[Mapping[str, Any]],
    outputs: Sequence[Artifact],
) -> str | None:
    """Why a stage may be skipped (a one-line reason), or None when it must run."""
    if record is None or record.get("status") != "completed":
        return None
    if record.get("config_sha256") != config_hash:
        return None
    if _comparable(record.get("inputs", [])) != _comparable(inputs):
        return None
    if missing(outputs):
        return None
    return f"completed at {record['finished_at']} with the same inputs and command"


def _comparable(items: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str | None]]:
    return sorted((i["name"], i["path"], i.get("sha256")) for i in items)
