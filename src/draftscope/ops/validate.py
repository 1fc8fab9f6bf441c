"""`invoke validate PATH`: every artifact of a run directory, or of a pipeline workdir, against its schema, one
verdict per file.

A run directory (it has `manifest.json`): the manifest (and the config in it), the copied inputs' hashes, the
records, the summary; and the Slurm ledger beside it (`<run>.slurm/jobs.json`) when the run was submitted.

A pipeline workdir (it has `pipeline.json`): the plan rebuilt from its frozen config tells where each stage's
outputs are and which have a schema. Every stage record (`stages/<stage>.json`); for a completed stage every
output it recorded, re-hashed (a file changed or lost since the stage completed fails here, as it would make the
next run redo the stage) and, where it has one, checked against its schema; every result file
(`stages/*.result.json`), the Slurm ledger (`slurm/jobs.json`) and the job-array tasks' outcomes
(`slurm/shards/<stage>/<I>.json`). A workdir moved elsewhere validates where it is now.
"""

from __future__ import annotations

from pathlib import Path

from draftscope.core.config import build
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.presets import load_model_preset
from draftscope.core.rundir import MANIFEST
from draftscope.core.validate import Report, _add_file, _schema_problems, validate_run
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.base import STAGES_DIR, Artifact
from draftscope.pipeline.config import PipelineConfig, Resolved
from draftscope.pipeline.state import RECORD_SCHEMA, fingerprint

PIPELINE_FILE = "pipeline.json"  # pipeline.base.CONFIG_FILE, without importing the pipeline package here


def validate_path(path: Path, *, final: bool = False) -> Report:
    """A run directory, or a pipeline workdir (a folder with pipeline.json and no manifest.json)."""
    path = Path(path)
    if path.is_dir() and not (path / MANIFEST).exists() and (path / PIPELINE_FILE).is_file():
        return validate_workdir(path)
    return validate_run(path, final=final)


def validate_workdir(path: Path) -> Report:
    """Validate a pipeline workdir: records, outputs (hashes and schemas), results, the Slurm ledger and tasks."""
    path = Path(path).absolute()  # the plan's paths are absolute: outputs are shown relative to the workdir
    if not (path / PIPELINE_FILE).is_file():
        raise UserError(
            "no pipeline.json here: not a pipeline workdir",
            source=str(path),
            fix="give the --workdir of an `invoke pipeline` run, or a run directory",
        )
    report = Report(path)
    outputs, problem = _planned_outputs(path)
    report.add(PIPELINE_FILE, "pipeline-config", [problem] if problem else [])

    def shown(file: Path) -> str:
        return file.relative_to(path).as_posix() + ("/" if file.is_dir() else "")

    for name in registry.NAMES:
        record_file = path / STAGES_DIR / f"{name}.json"
        if not record_file.is_file():
            continue
        record = _add_file(report, record_file, RECORD_SCHEMA, shown(record_file))
        if (
            not isinstance(record, dict)
            or record.get("status") != "completed"
            or report.verdicts[-1].ok is False
        ):
            continue
        planned = outputs.get(name, {})
        for entry in record.get("outputs") or []:
            artifact = planned.get(entry["name"])
            if artifact is None:  # the plan no longer declares it (another kit version): the recorded path
                artifact = Artifact(entry["name"], Path(entry["path"]), entry.get("kind", "file"))
            where = shown(artifact.path) if artifact.path.is_relative_to(path) else str(artifact.path)
            now = fingerprint(artifact)
            if now is None or now["sha256"] is None:
                report.add(
                    where, artifact.schema, [f"missing: stage {name} recorded it as output {entry['name']!r}"]
                )
            elif now["sha256"] != entry["sha256"]:
                report.add(
                    where,
                    artifact.schema,
                    [
                        f"changed since stage {name} completed (sha256 {now['sha256'][:12]}…, "
                        f"recorded {str(entry['sha256'])[:12]}…): the next run redoes the stage"
                    ],
                )
            elif artifact.schema and artifact.kind == "file":
                _add_file(report, artifact.path, artifact.schema, where)
            else:
                report.add(where, None, [])
    for file in sorted((path / STAGES_DIR).glob("*.result.json")):
        _add_file(report, file, "stage-result", shown(file))
    ledger = path / "slurm" / "jobs.json"
    if ledger.is_file():
        _add_file(report, ledger, "slurm-jobs", shown(ledger))
    for file in sorted((path / "slurm" / "shards").glob("*/*.json")):
        _add_file(report, file, "slurm-shard", shown(file))
    return report


def _unset_dropped(value: object) -> object:
    """The frozen config as a user would write it: a setting left unset is frozen as null, and written as absent."""
    if isinstance(value, dict):
        return {k: _unset_dropped(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_unset_dropped(v) for v in value]
    return value


def _planned_outputs(path: Path) -> tuple[dict, str | None]:
    """Stage → output name → Artifact, from the plan rebuilt here with the workdir's frozen config (every stage,
    at this folder); ({}, the problem) when pipeline.json cannot be read or planned with this kit."""
    try:
        doc = read_json(path / PIPELINE_FILE)
        frozen = _unset_dropped(doc.get("config") if isinstance(doc, dict) else None)
        problems = _schema_problems(frozen, "pipeline-config", prefix="$.config")
        if problems:
            return {}, problems[0]
        config = build(PipelineConfig, doc["config"])
        plan = planning.build(
            Resolved(config, load_model_preset(config.model_preset), str(doc.get("source"))),
            registry.STAGES,
            path.absolute(),
            str(doc.get("runtime")),
        )
    except UserError as exc:
        return {}, exc.message
    except (KeyError, TypeError, ValueError) as exc:
        return {}, f"$: not a pipeline.json this kit wrote ({type(exc).__name__}: {exc})"
    return {sp.stage.name: {a.name: a for a in sp.outputs} for sp in plan.stages}, None
