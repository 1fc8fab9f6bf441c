"""`invoke share RUN --output BUNDLE.tar.gz`: a run packed for an issue report or a reviewer, text left out.

Prompts and generated text stay local (DESIGN.md, run directory contract), so the bundle is built from an allow
list, not by deleting from a copy: under `<run_id>/` it holds

    manifest.json   the manifest as recorded (status, reason, images, hardware, versions, input hashes)
    config.json     the frozen config (the manifest's `config`)
    summary.json    when the run wrote one
    worker.json     the worker's facts (backend, load time, versions), when present
    records.jsonl   every record without its text: generated token ids (they decode to the generated text) and
                    any text field are removed; a torn last line is left out
    hardware.json   the run's hardware and the packing host's (`invoke doctor`, without paths)
    SHARE.json      what was packed, what was removed or left out and why, the kit that packed it
    SHA256SUMS      `sha256sum -c` format, for every file above

`--include-text` keeps the records whole and adds everything else of the run (prompt copies under inputs/, logs/,
captured head calls). Archive members get fixed modes, owners and times, and gzip no timestamp: only the packing
time and host in SHARE.json and hardware.json differ between two bundles of one run.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope import __version__
from draftscope.errors import UserError
from draftscope.provenance import now
from draftscope.rundir import RESERVE

# Record fields that hold text or token ids, wherever they appear in a record (`extra` included). Token ids are
# text: anyone with the tokenizer decodes them.
TEXT_FIELDS = frozenset(
    {
        "generated_token_ids",
        "generated_text",
        "token_ids",
        "input_ids",
        "output_ids",
        "output_token_ids",
        "prompt_token_ids",
        "text",
        "prompt",
        "prompt_text",
        "output_text",
        "completion",
        "messages",
        "content",
    }
)
# Files packed as they are (when present); records.jsonl is packed redacted.
AS_IS = ("manifest.json", "summary.json", "worker.json")
RECORDS = "records.jsonl"
# Internal bookkeeping of a run directory (space set aside for the final status): never packed nor listed.
SKIP = (RESERVE,)
ARCHIVE_MODE = 0o644


@dataclass
class Bundle:
    """What `pack` wrote: the archive, its files, and what it removed or left out."""

    output: Path
    files: list[str]
    records: int
    redacted_fields: list[str]
    left_out: list[str]
    torn_lines: int = 0
    include_text: bool = False

    def lines(self) -> list[str]:
        out = [f"{self.output}: {len(self.files)} files ({', '.join(self.files)})"]
        if self.include_text:
            out.append("text included (--include-text): prompts, generated tokens and logs are in the bundle")
        else:
            removed = ", ".join(self.redacted_fields) or "nothing to remove"
            out.append(f"records: {self.records}, text removed ({removed})")
            if self.left_out:
                out.append(f"left out: {', '.join(self.left_out)} (--include-text packs them)")
        if self.torn_lines:
            out.append(f"records: {self.torn_lines} incomplete line(s) left out")
        return out


def redact(record: Any) -> tuple[Any, set[str]]:
    """The record without TEXT_FIELDS at any depth, and the names removed."""
    removed: set[str] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if key in TEXT_FIELDS:
                    removed.add(key)
                    continue
                out[key] = walk(item)
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(record), removed


def _records(path: Path, include_text: bool) -> tuple[bytes, int, set[str], int]:
    """(records.jsonl bytes, records kept, fields removed, torn or invalid lines left out)."""
    out, removed, kept, torn = [], set(), 0, 0
    with path.open("rb") as fh:
        for raw in fh:
            try:
                record = json.loads(raw) if raw.endswith(b"\n") else None
            except ValueError:
                record = None
            if not isinstance(record, dict):
                torn += bool(raw.strip())  # a killed writer's last line, or a damaged one: never packed
                continue
            if not include_text:
                record, names = redact(record)
                removed |= names
            out.append(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
            kept += 1
    return "".join(out).encode("utf-8"), kept, removed, torn


def host_report(collect: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The packing host as `invoke doctor` sees it, without paths (disk location, CDI files) or image IDs."""
    from draftscope import doctor

    report = (collect or doctor.collect)()
    toolkit = report.get("toolkit") or {}
    return {
        "system": {
            "platform": sys.platform,
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
        "gpus": report.get("gpus", []),
        "gpu_source": report.get("gpu_source"),
        "unsupported_accelerators": report.get("unsupported_accelerators", []),
        "engines": [{k: e.get(k) for k in ("name", "answers", "version")} for e in report.get("engines", [])],
        "nvidia_container_toolkit": {
            "nvidia_ctk": toolkit.get("nvidia_ctk"),
            "runtime": bool(toolkit.get("runtime")),
            "cdi_specs": len(toolkit.get("cdi_specs") or []),
        },
        "memory": report.get("memory"),
        "verdict": report.get("verdict", []),
    }


def _read_manifest(run: Path) -> dict[str, Any]:
    from draftscope.jsonio import read_json

    if not (run / "manifest.json").is_file():
        hint = (
            "a pipeline workdir has no manifest: share the benchmark runs, or attach stages/*.json"
            if (run / "pipeline.json").is_file()
            else "give a run directory that `invoke benchmark` or `invoke reproduce` created"
        )
        raise UserError("not a run directory (no manifest.json)", source=str(run), fix=hint)
    manifest = read_json(run / "manifest.json")
    if not isinstance(manifest, dict):
        raise UserError("manifest.json is not a JSON object", source=str(run))
    return manifest


def _check_output(run: Path, output: Path) -> None:
    if output.exists() or output.is_symlink():
        raise UserError(
            "the bundle already exists", field="--output", value=str(output), fix="choose a new file name"
        )
    if not output.parent.is_dir():
        raise UserError(
            "the bundle's folder does not exist", field="--output", value=str(output.parent), fix="create it"
        )
    if output.resolve().is_relative_to(run.resolve()):
        raise UserError(
            "the bundle must not be written inside the run directory (a run is never modified)",
            field="--output",
            value=str(output),
            fix="write it next to the run, e.g. --output bundle.tar.gz",
        )


def _other_files(run: Path, packed: set[str]) -> list[str]:
    """Every file of the run not packed as such, relative to the run, sorted."""
    found = []
    for path in sorted(run.rglob("*")):
        rel = path.relative_to(run).as_posix()
        if path.is_file() and not path.is_symlink() and rel not in packed and path.name not in SKIP:
            found.append(rel)
    return found


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def pack(
    run: Path | str,
    output: Path | str,
    *,
    include_text: bool = False,
    collect: Callable[[], dict[str, Any]] | None = None,
) -> Bundle:
    """Write the bundle of `run` to `output` (a new file); nothing in the run directory changes."""
    run, output = Path(run), Path(output)
    if not run.is_dir():
        raise UserError("no such run directory", source=str(run), fix="give the path of a run directory")
    manifest = _read_manifest(run)
    _check_output(run, output)

    members: dict[str, bytes] = {}
    for name in AS_IS:
        if (run / name).is_file():
            members[name] = (run / name).read_bytes()
    members["config.json"] = _dumps(manifest.get("config"))
    kept = torn = 0
    removed: set[str] = set()
    if (run / RECORDS).is_file():
        members[RECORDS], kept, removed, torn = _records(run / RECORDS, include_text)
    others = _other_files(run, set(AS_IS) | {RECORDS})
    if include_text:
        for rel in others:
            members[rel] = (run / rel).read_bytes()
    left_out = [] if include_text else others
    worker = _json_or_none(members.get("worker.json"))
    members["hardware.json"] = _dumps(
        {
            "run": manifest.get("hardware"),
            "worker": (worker or {}).get("hardware"),
            "packing_host": host_report(collect),
        }
    )
    bundle = Bundle(output, [], kept, sorted(removed), left_out, torn, include_text)
    members["SHARE.json"] = _dumps(
        {
            "schema_version": 1,
            "run_id": manifest.get("run_id", run.name),
            "status": manifest.get("status"),
            "packed_at": now(),
            "packed_by": f"draftscope {__version__}",
            "include_text": include_text,
            "records": {"kept": kept, "fields_removed": sorted(removed), "incomplete_lines_left_out": torn},
            "left_out": left_out,
            "note": (
                "text included: prompts and generated tokens are in this bundle"
                if include_text
                else "prompt text, generated text and generated token ids are not in this bundle"
            ),
        }
    )
    names = sorted(members)
    sums = "".join(f"{hashlib.sha256(members[n]).hexdigest()}  {n}\n" for n in names)
    members["SHA256SUMS"] = sums.encode()
    bundle.files = [*names, "SHA256SUMS"]
    _write_archive(output, str(manifest.get("run_id") or run.name), members, bundle.files)
    return bundle


def _json_or_none(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _write_archive(output: Path, top: str, members: Mapping[str, bytes], order: list[str]) -> None:
    """A deterministic .tar.gz, created exclusively; a failure removes the partial file."""
    try:
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError("the bundle already exists", field="--output", value=str(output)) from None
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in order:
                data = members[name]
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mode, info.mtime = len(data), ARCHIVE_MODE, 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    except BaseException:
        output.unlink(missing_ok=True)
        raise
