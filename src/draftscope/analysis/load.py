"""Run directories → `Run` objects: manifest, records, summary, and the labels every table and report shows.

A run is read as it is on disk. A partial run (timed out, failed, interrupted, or still running) is loaded and
labelled partial, never dropped; a torn last line of records.jsonl (a writer killed mid-line) is skipped with a
note. Records are checked against the record schema, so later code can rely on their fields.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from draftscope.core import integrity
from draftscope.core import schema as schemas
from draftscope.core.config import build
from draftscope.core.errors import UserError
from draftscope.core.jsonio import parse_json, read_json, sha256_file
from draftscope.core.presets import ExperimentConfig, load_model_preset, resolve_draft, resolve_target
from draftscope.core.rundir import FINAL, MANIFEST, RECORDS, SUMMARY, liveness
from draftscope.core.summary import summarize
from draftscope.core.untrusted import check_file, check_run_id


@dataclass(frozen=True)
class PromptRows:
    """All records of one prompt in one run, joined on the prompt hash; `prompt_id` is for display."""

    prompt_sha256: str
    prompt_id: str
    records: tuple[dict[str, Any], ...]

    def seconds(self, repeats: Iterable[int] | None = None) -> list[float]:
        wanted = None if repeats is None else set(repeats)
        return [r["request_seconds"] for r in self.records if wanted is None or r["repeat"] in wanted]

    def median_seconds(self, repeats: Iterable[int] | None = None) -> float | None:
        values = self.seconds(repeats)
        return statistics.median(values) if values else None


@dataclass
class Run:
    path: Path
    manifest: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def status(self) -> str:
        return self.manifest["status"]

    @property
    def partial(self) -> bool:
        """Anything but a completed run is partial: its records are real but may not cover every prompt."""
        return self.status != "completed" or bool(self.summary.get("partial"))

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    @property
    def backend(self) -> str:
        c = self.config
        text = c.get("backend", "?")
        if c.get("int4_dflash"):
            text += " int4+dflash2"
        if c.get("experimental_prefix"):
            text += " +prefix (experimental)"
        return text

    @cached_property
    def _resolved(self) -> tuple[str, str | None]:
        return resolve_labels(self.config)

    @property
    def target(self) -> str:
        return self._resolved[0]

    @property
    def draft(self) -> str | None:
        return self._resolved[1]

    @property
    def repeats(self) -> list[int]:
        return sorted({r["repeat"] for r in self.records})

    @property
    def speculative(self) -> bool:
        return any(r.get("acceptance_lengths") for r in self.records)

    @property
    def prompts_sha256(self) -> str | None:
        for item in self.manifest.get("inputs", []):
            if item.get("name") == "prompts":
                return item["sha256"]
        return None

    @property
    def status_label(self) -> str:
        if not self.partial:
            return "completed"
        reason = self.manifest.get("reason")
        return f"partial ({self.status}{': ' + reason if reason else ''})"

    @property
    def hardware_label(self) -> str:
        return hardware_label(self.manifest.get("hardware"))

    @property
    def images_label(self) -> str:
        return images_label(self.manifest.get("images") or [])

    @property
    def dtype(self) -> str | None:
        facts = (self.manifest.get("software") or {}).get("backend") or {}
        return facts.get("dtype") or self.config.get("dtype")

    @cached_property
    def by_prompt(self) -> dict[str, PromptRows]:
        """prompt hash → its records (repeat order), in the order prompts first appear."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for r in self.records:
            grouped.setdefault(r["prompt_sha256"], []).append(r)
        return {
            sha: PromptRows(sha, rows[0]["prompt_id"], tuple(sorted(rows, key=lambda r: r["repeat"])))
            for sha, rows in grouped.items()
        }

    def describe(self) -> dict[str, Any]:
        """The identity block a comparison records for each of its two runs."""
        records = self.path / RECORDS
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "status": self.status,
            "partial": self.partial,
            "manifest_sha256": sha256_file(self.path / MANIFEST),
            "records_sha256": sha256_file(records) if records.is_file() else None,
            "config_name": str(self.config.get("name", "?")),
            "backend": self.backend,
            "target": self.target,
            "draft": self.draft,
            "repeats": len(self.repeats),
            "prompts_sha256": self.prompts_sha256,
            "records": len(self.records),
        }


def load_run(path: Path | str) -> Run:
    """Read one run directory; a folder without a manifest is a one-line error."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        raise UserError(
            "not a run directory (no manifest.json)",
            source=str(path),
            fix="give a folder that `invoke benchmark` created",
        )
    for name in (MANIFEST, RECORDS, SUMMARY):  # regular files of the run: no pipe, folder or link out of it
        check_file(path, name)
    manifest = read_json(path / MANIFEST, expect=dict)
    schemas.check(manifest, "run-manifest", str(path / MANIFEST))
    check_run_id(manifest["run_id"], source=str(path / MANIFEST))  # it names comparison files
    records, notes = read_records(path / RECORDS)
    if (path / SUMMARY).is_file():
        partial = manifest["status"] != "completed" if manifest["status"] in FINAL else None
        summary = _checked_summary(path, read_json(path / SUMMARY, expect=dict), records, partial)
        if "records_sha256" not in summary:
            notes.append(f"summary.json: {integrity.MISSING_HASH}")
        summary = integrity.recompute(summary, records, integrity.prompt_ids(path), partial)
    else:
        prompt_ids = list(dict.fromkeys(r["prompt_id"] for r in records))
        summary = summarize(
            manifest["run_id"], records, prompt_ids, partial=manifest["status"] != "completed"
        )
        notes.append("no summary.json (the run did not finish); figures computed from its records")
    if manifest["status"] not in FINAL:
        state = liveness(path, manifest["status"])
        if state.state == "gone":
            notes.append(f"{state.describe()}; `invoke recover {path}` finishes its record")
        elif state.state == "live":
            notes.append(f"{state.describe()}: its figures are still growing")
    return Run(path, manifest, records, summary, notes)


def _checked_summary(path: Path, summary: dict, records: list[dict[str, Any]], partial: bool | None) -> dict:
    """The stored summary when it follows from the records (core/integrity.py); any disagreement is refused,
    naming the field, so `analyze` and `compare` can never show different figures for one run."""
    problems = [f"{p.path}: {p.message}" for p in schemas.problems(summary, "summary")]
    if not problems and summary["records"] != len(records):
        problems.append(f"$.records: says {summary['records']} but records.jsonl has {len(records)}")
    if not problems:
        problems = integrity.problems(path, summary, records, partial if "partial" in summary else None)
    if problems:
        raise UserError(
            problems[0],
            source=str(path / SUMMARY),
            fix="the run's summary and records disagree: re-run it (or `invoke validate` it to see every problem)",
        )
    return summary


def load_runs(paths: Sequence[Path | str]) -> list[Run]:
    """Several runs; a folder that is not itself a run but holds runs stands for each of them (sorted)."""
    runs: list[Run] = []
    for raw in paths:
        path = Path(raw)
        if not (path / MANIFEST).is_file() and path.is_dir():
            children = sorted(p for p in path.iterdir() if (p / MANIFEST).is_file())
            if children:
                runs.extend(load_run(p) for p in children)
                continue
        runs.append(load_run(path))
    if not runs:
        raise UserError("no run directories given", fix="name one or more run directories")
    return runs


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every complete record line; a torn final line (no newline: the writer was killed) is skipped with a note."""
    notes: list[str] = []
    if not path.is_file():
        return [], ["no records.jsonl"]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte {exc.start})", source=str(path)) from None
    lines = text.split("\n")
    if lines[-1].strip():
        notes.append("records.jsonl ends in a torn line (the writer was stopped mid-record); it was skipped")
    records = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        record = parse_json(line, str(path), line=number)
        schemas.check(record, "record", f"{path} line {number}")
        records.append(record)
    return records, notes


def resolve_labels(config: Mapping[str, Any]) -> tuple[str, str | None]:
    """(target, draft) as `repo@revision`, or '<preset> (kit-built)' for a model the kit builds itself."""
    try:
        experiment = build(ExperimentConfig, config)
        preset = load_model_preset(experiment.model_preset)
        target_ref = resolve_target(experiment, preset)
        draft_ref = resolve_draft(experiment, preset)
    except UserError:
        # A preset that no longer exists here: say what the manifest says rather than fail the analysis.
        return f"preset {config.get('model_preset', '?')} (not found here)", config.get("draft")
    target = target_ref.display() if target_ref else f"{preset.name} (kit-built)"
    if draft_ref is not None:
        draft = draft_ref.display()
    elif experiment.draft == "tiny":
        draft = "tiny (kit-built)"
    else:
        draft = None
    return target, draft


def hardware_label(hw: Mapping[str, Any] | None) -> str:
    if not hw:
        return "not recorded"
    gpu = hw.get("gpu")
    if gpu:
        parts = [f"{gpu.get('count', 1)}× {gpu.get('name', 'GPU')}"]
        if gpu.get("memory_mib"):
            parts.append(f"{gpu['memory_mib'] / 1024:.0f} GiB")
        if gpu.get("capability"):
            parts.append("sm_" + "".join(map(str, gpu["capability"])))
        if gpu.get("cuda"):
            parts.append(f"CUDA {gpu['cuda']}")
        if gpu.get("driver"):
            parts.append(f"driver {gpu['driver']}")
        return ", ".join(parts)
    parts = [f"CPU {hw.get('machine') or '?'}"]
    if hw.get("cpu_count"):
        parts.append(f"{hw['cpu_count']} cores")
    if hw.get("torch_threads"):
        parts.append(f"{hw['torch_threads']} torch threads")
    return ", ".join(parts)


def images_label(images: Sequence[Mapping[str, Any]]) -> str:
    if not images:
        return "not recorded"
    out = []
    for item in images:
        if item.get("runtime") == "local":
            out.append(f"{item['step']}: local runtime (no image)")
            continue
        ident = (item.get("repo_digests") or [None])[0] or item.get("id") or "no id"
        out.append(f"{item['step']}: {item.get('reference')} {ident}")
    return "; ".join(out)
