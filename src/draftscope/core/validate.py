"""A run directory's artifacts against their schemas, one verdict per file: the manifest (and the config in it),
the copied inputs' hashes, the records, the summary, and the Slurm ledger beside it (`<run>.slurm/jobs.json`) when
the run was submitted. The run directory checks itself with this before it is marked completed; `invoke validate`
(draftscope.ops.validate) adds pipeline workdirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftscope.core import integrity
from draftscope.core import schema as schemas
from draftscope.core.errors import UserError
from draftscope.core.jsonio import iter_jsonl, read_json, sha256_file
from draftscope.core.layout import CONFIG_SCHEMAS, MANIFEST, RECORDS, SUMMARY, slurm_folder_of
from draftscope.core.untrusted import file_problem

# Kinds whose completed runs must have a summary.json.
SUMMARY_KINDS = frozenset({"benchmark", "reproduce"})


@dataclass
class Verdict:
    file: str
    schema: str | None
    ok: bool
    detail: str = ""

    def line(self) -> str:
        tag = "ok  " if self.ok else "FAIL"
        what = f" ({self.schema})" if self.schema else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{tag} {self.file}{what}{detail}"


@dataclass
class Report:
    run: Path
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def add(self, file: str, schema: str | None, problems: list[str]) -> None:
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            self.verdicts.append(Verdict(file, schema, False, problems[0] + more))
        else:
            self.verdicts.append(Verdict(file, schema, True))

    def first_failure(self) -> str:
        for v in self.verdicts:
            if not v.ok:
                return f"{v.file}: {v.detail}"
        return ""


def _schema_problems(instance: object, schema: str, prefix: str = "$") -> list[str]:
    return [f"{prefix}{p.path[1:]}: {p.message}" for p in schemas.problems(instance, schema)]


def validate_run(path: Path, *, final: bool = False) -> Report:
    """Validate a run directory. `final` demands the artifacts of a finished run (the summary) now."""
    path = Path(path)
    if not path.is_dir():
        raise UserError("no such run directory", source=str(path), fix="give a folder a run created")
    report = Report(path)

    manifest = None
    unreadable = {name: file_problem(path, name) for name in (MANIFEST, RECORDS, SUMMARY)}
    if unreadable[MANIFEST] or not (path / MANIFEST).exists():
        report.add(MANIFEST, "run-manifest", [unreadable[MANIFEST] or "missing: not a run directory"])
    else:
        try:
            manifest = read_json(path / MANIFEST)
        except UserError as exc:
            report.add(MANIFEST, "run-manifest", [f"$: {exc.message}"])
    if manifest is not None:
        problems = _schema_problems(manifest, "run-manifest")
        config_schema = CONFIG_SCHEMAS.get(manifest.get("kind")) if isinstance(manifest, dict) else None
        if not problems and config_schema:
            problems += _schema_problems(manifest["config"], config_schema, prefix="$.config")
        if not problems:
            problems += _input_problems(path, manifest)
        report.add(MANIFEST, "run-manifest", problems)

    kind = manifest.get("kind") if isinstance(manifest, dict) else None
    status = manifest.get("status") if isinstance(manifest, dict) else None
    run_id = manifest.get("run_id") if isinstance(manifest, dict) else None

    n_records = None
    records: list | None = (
        None  # the parsed records when every line is schema-valid (the summary is recomputed)
    )
    if unreadable[RECORDS]:
        report.add(RECORDS, "record", [unreadable[RECORDS]])
    elif (path / RECORDS).exists():
        problems: list[str] = []
        n_records, parsed = 0, []
        try:
            for number, record in iter_jsonl(path / RECORDS):
                n_records += 1
                parsed.append(record)
                problems += [f"line {number}: {p}" for p in _schema_problems(record, "record")]
        except UserError as exc:
            problems.append(exc.message)
        except UnicodeDecodeError as exc:
            problems.append(f"not UTF-8 text (byte {exc.start})")
        report.add(RECORDS, "record", problems)
        records = None if problems else parsed
    elif kind in SUMMARY_KINDS and (status == "completed" or (path / SUMMARY).exists()):
        # The supervisor creates records.jsonl before its first step: a summarized run without it lost its records.
        report.add(RECORDS, "record", ["missing: a run with a summary keeps its records.jsonl (even empty)"])

    if unreadable[SUMMARY]:
        report.add(SUMMARY, "summary", [unreadable[SUMMARY]])
    elif (path / SUMMARY).exists():
        problems = []
        try:
            summary = read_json(path / SUMMARY)
        except UserError as exc:
            problems.append(f"$: {exc.message}")
        else:
            problems = _schema_problems(summary, "summary")
            if not problems and run_id is not None and summary["run_id"] != run_id:
                problems.append(f"$.run_id: '{summary['run_id']}' differs from the manifest's '{run_id}'")
            if not problems and n_records is not None and summary["records"] != n_records:
                problems.append(f"$.records: says {summary['records']} but records.jsonl has {n_records}")
            if not problems and records is not None:
                final_status = status in ("completed", "failed", "timed_out", "interrupted")  # rundir.FINAL
                partial = (status != "completed") if final_status and "partial" in summary else None
                problems += integrity.problems(path, summary, records, partial)
        report.add(SUMMARY, "summary", problems)
        if not problems and "records_sha256" not in summary:
            report.verdicts[-1].detail = f"warning: {integrity.MISSING_HASH}"
    elif kind in SUMMARY_KINDS and (status == "completed" or final):
        report.add(SUMMARY, "summary", ["missing: a completed run must have a summary.json"])

    ledger = slurm_folder_of(path.absolute()) / "jobs.json"
    if ledger.is_file():
        _add_file(report, ledger, "slurm-jobs", f"../{ledger.parent.name}/{ledger.name}")
    return report


def _add_file(report: Report, file: Path, schema: str, shown: str) -> dict | None:
    """One JSON file against its schema; the document when it could be read (the reading boundary refuses a pipe,
    a folder or an unreadable path as a UserError, before it opens anything that could block)."""
    try:
        doc = read_json(file)
    except UserError as exc:
        report.add(shown, schema, [f"$: {exc.message}"])
        return None
    report.add(shown, schema, _schema_problems(doc, schema))
    return doc


def _input_problems(path: Path, manifest: dict) -> list[str]:
    """Every input the manifest records must still be copied in the run (`inputs/NAME`, a regular file of the run)
    with the hash recorded: without its copy a run cannot be reproduced from its directory alone."""
    problems = []
    for index, item in enumerate(manifest.get("inputs", [])):
        name = Path(item["path"]).name
        where = f"$.inputs[{index}]"
        if name in ("", ".", ".."):
            problems.append(f"{where}.path: {item['path']!r} names no file")
            continue
        rel = f"inputs/{name}"
        problem = file_problem(path, rel)
        if problem:
            problems.append(f"{where}: {problem}")
        elif not (path / rel).exists():
            problems.append(
                f"{where}: {rel} is missing: the run's copy of its {item['name']} input was deleted"
            )
        elif sha256_file(path / rel) != item["sha256"]:
            problems.append(f"{where}.sha256: {rel} no longer has the recorded hash")
    return problems
