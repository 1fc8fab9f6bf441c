"""A run logged to an MLflow tracking store: its parameters, its summary figures and acceptance ledger as metrics,
its manifest, summary (and report, where given) as artifacts, tagged with the kit's version and commit.

Through `MlflowClient` only (no global active run): any tracking URI MLflow takes (`sqlite:///mlflow.db`, a
server's `http(s)://…`). A run already logged to the experiment (tag `draftscope.run_id`) is refused rather than
logged twice. The MLflow run's start and end times are the kit run's; its status FINISHED for a completed run,
KILLED for one stopped (timed out, interrupted) and FAILED otherwise. docs/use/exports.md lists every name.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any

import draftscope
from draftscope.analysis.load import Run
from draftscope.core import acceptance
from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.rundir import MANIFEST, SUMMARY

RUN_TAG = "draftscope.run_id"
STATUS = {"completed": "FINISHED", "timed_out": "KILLED", "interrupted": "KILLED"}
FIGURES = ("request_tok_s", "decode_tok_s", "request_seconds", "generated_tokens")
LEDGER = (
    "mean_pooled",
    "mean_per_request",
    "mean_token_weighted",
    "rate",
    "steps",
    "emitted_tokens",
    "accepted_drafts",
    "proposed_drafts",
    "requests",
)


def params(run: Run) -> dict[str, str]:
    """What the run was: preset, backend, models with revisions, draft and k, prompts hash, budget."""
    config = run.config
    values = {
        "run_id": run.run_id,
        "config_name": config.get("name"),
        "backend": run.backend,
        "model_preset": config.get("model_preset"),
        "target": run.target,
        "draft": run.draft,
        "draft_tokens": config.get("draft_tokens") if run.draft else None,
        "prompts_sha256": run.prompts_sha256,
        "repeats": config.get("repeats"),
        "warmups": config.get("warmups"),
        "max_new_tokens": config.get("max_new_tokens"),
        "fixed_tokens": config.get("fixed_tokens"),
        "device": config.get("device"),
        "dtype": run.dtype,
        "runtime": config.get("runtime"),
        "seed": config.get("seed"),
        "hardware": run.hardware_label,
        "images": run.images_label,
    }
    return {key: str(value) for key, value in values.items() if value is not None}


def metrics(run: Run) -> dict[str, float]:
    """The summary's figures: counts, overall median/min/max, and the acceptance ledger (per position too)."""
    summary = run.summary
    out: dict[str, float] = {
        "records": summary["records"],
        "prompts_total": summary["prompts_total"],
        "prompts_completed": summary["prompts_completed"],
        "greedy_agreement": 1.0 if summary["greedy_agreement"] else 0.0,
    }
    overall = summary.get("overall") or {}
    for name in FIGURES:
        stat = overall.get(name)
        for key in ("median", "min", "max"):
            if stat:
                out[f"{name}.{key}"] = stat[key]
    # A summary written before the acceptance ledger existed has none: the ledger of its records, as `analyze` shows.
    ledger = overall.get("acceptance") or acceptance.from_records(run.records)
    if ledger:
        for name in LEDGER:
            if ledger.get(name) is not None:
                out[f"acceptance.{name}"] = ledger[name]
        for i, rate in enumerate(ledger.get("per_position") or (), start=1):
            if rate is not None:
                out[f"acceptance.per_position.{i}"] = rate
    return {key: float(value) for key, value in out.items()}


def tags(run: Run) -> dict[str, str]:
    kit = run.manifest["kit"]
    return {
        RUN_TAG: run.run_id,
        "draftscope.status": run.status,
        "draftscope.run_kit_version": kit["version"],
        "draftscope.run_kit_commit": str(kit.get("git_commit")),
        "draftscope.run_kit_dirty": str(kit.get("git_dirty")),
        "draftscope.export_kit_version": draftscope.__version__,
        "mlflow.runName": run.run_id,
    }


def log_run(run: Run, tracking_uri: str, experiment: str, report: Path | None = None) -> str:
    """Log `run` to the tracking store; the MLflow run id."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MissingDependency("mlflow", extra="export") from None
    from mlflow.exceptions import MlflowException

    artifacts = _artifacts(run, report)
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        earlier = client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run.run_id}'", max_results=1
        )
    except MlflowException as exc:
        raise UserError(
            f"MLflow refused the tracking store: {_said(exc)}",
            field="--tracking-uri",
            value=tracking_uri,
            fix="give a tracking URI MLflow takes, e.g. sqlite:///mlflow.db or http://HOST:5000",
        ) from None
    if earlier:
        raise UserError(
            f"already logged to experiment {experiment!r} as MLflow run {earlier[0].info.run_id}",
            field="--experiment",
            value=experiment,
            fix="log it to another experiment, or delete that MLflow run first",
        )
    return _log(client, experiment_id, run, artifacts, MlflowException)


def _artifacts(run: Run, report: Path | None) -> list[Path]:
    """manifest.json, summary.json and a report.html (given, or in the run directory), each a regular file."""
    artifacts = [run.path / MANIFEST, run.path / SUMMARY]
    for path in artifacts:
        if not path.is_file():
            raise UserError(
                "the run has no such file to log", source=str(path), fix="finish or `invoke recover` the run"
            )
    if report is not None:
        page = report / "report.html" if report.is_dir() else report
        if not page.is_file() or page.name != "report.html":
            raise UserError(
                "not a report",
                field="--report",
                value=str(report),
                fix="give `invoke analyze --report`'s folder",
            )
        artifacts.append(page)
    elif (run.path / "report.html").is_file():
        artifacts.append(run.path / "report.html")
    return artifacts


def _log(client: Any, experiment_id: str, run: Run, artifacts: list[Path], failure: type[Exception]) -> str:
    """One MLflow run: created with the run's start time and tags, then parameters, metrics and artifacts; a
    failure half-way marks it FAILED and names it."""
    from mlflow.entities import Metric, Param, RunTag

    started = _millis(run.manifest.get("started_at") or run.manifest["created_at"])
    run_id = client.create_run(
        experiment_id, start_time=started, tags=tags(run), run_name=run.run_id
    ).info.run_id
    try:
        client.log_batch(
            run_id,
            metrics=[Metric(k, v, started, 0) for k, v in metrics(run).items()],
            params=[Param(k, v) for k, v in params(run).items()],
            tags=[
                RunTag("draftscope.exported_at", datetime.now().astimezone().isoformat(timespec="seconds"))
            ],
        )
        for path in artifacts:
            client.log_artifact(run_id, str(path))
    except (failure, OSError) as exc:
        with contextlib.suppress(failure, OSError):
            client.set_terminated(run_id, status="FAILED")
        raise UserError(
            f"logging stopped half-way ({_said(exc)}); MLflow run {run_id} is marked FAILED",
            source=run.run_id,
            fix=f"delete MLflow run {run_id}, fix the cause, and export again",
        ) from None
    ended = run.manifest.get("finished_at") or run.manifest["updated_at"]
    client.set_terminated(run_id, status=STATUS.get(run.status, "FAILED"), end_time=_millis(ended))
    return run_id


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 240 else text[:237] + "..."


def _millis(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
