"""`export`: runs as a table (CSV, JSON lines, Parquet), as `vllm bench serve --save-result` JSON, or logged to
an MLflow tracking store. Thin: options checked before any run is read, then `draftscope.analysis`."""

from __future__ import annotations

from pathlib import Path

from draftscope.analysis.load import load_runs
from draftscope.analysis.output import refuse_existing
from draftscope.bench.options import BENCHMARK
from draftscope.cli.analysis import ANALYZE
from draftscope.cli.command import command
from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable

TABLES = ("csv", "jsonl", "parquet")
FORMATS = (*TABLES, "vllm-bench", "mlflow")
DEFAULT_EXPERIMENT = "draftscope"
NEEDS = {"parquet": "pyarrow.parquet", "mlflow": "mlflow.tracking"}  # from the `export` extra

# --experiment has its default in words only: given with a format other than mlflow, it is refused.
EXPORT = OptionTable.of(
    ANALYZE.only("path", "run").changed(
        "run", help="one more run directory or folder: export A --run B (draftscope export A B)"
    ),
    Option(
        "format",
        "csv, jsonl or parquet (one row per record), vllm-bench (vLLM's --save-result JSON, one line per run) or "
        "mlflow (log each run to --tracking-uri)",
        choices=FORMATS,
        required=True,
        metavar="FORMAT",
        fix=f"add --format {'|'.join(FORMATS)}",
    ),
    BENCHMARK.only("output").changed(
        "output", help="the file to create (never overwritten); not for --format mlflow", metavar="FILE"
    ),
    Option(
        "tracking_uri",
        "--format mlflow: the tracking store, e.g. sqlite:///mlflow.db or http://HOST:5000",
        metavar="URI",
    ),
    BENCHMARK.only("experiment").changed(
        "experiment",
        help="--format mlflow: the experiment (created if new)",
        metavar="NAME",
        default_text=DEFAULT_EXPERIMENT,
    ),
    Option(
        "report",
        "--format mlflow: a report folder or report.html (`invoke analyze --report`) to log too",
        metavar="PATH",
    ),
)


@command(table=EXPORT, variadic="run")
def export(c, **values):
    """Write runs' records as csv/jsonl/parquet or vLLM JSON, or log to MLflow.

    Write runs' records as csv/jsonl/parquet rows or as vLLM benchmark result JSON, or log runs (parameters,
    summary metrics, acceptance ledger, manifest and summary) to MLflow; docs/use/exports.md names every field."""
    fmt, path, run, output = values["format"], values["path"], values["run"], values["output"]
    tracking_uri, experiment, report = values["tracking_uri"], values["experiment"], values["report"]
    if fmt in NEEDS:
        from draftscope.analysis.export import require  # lazy: numpy, only for `export`

        require(NEEDS[fmt])  # a missing extra is said before any run is read
    if fmt == "mlflow":
        _mlflow(path, run, tracking_uri, experiment, report, output)
        return
    for value, flag in ((tracking_uri, "--tracking-uri"), (experiment, "--experiment"), (report, "--report")):
        if value is not None:
            raise UserError(
                "only for --format mlflow", field=flag, value=value, fix=f"drop {flag} with --format {fmt}"
            )
    target = _output(output, fmt)
    runs = _distinct(load_runs([path, *(run or ())]))
    if fmt == "vllm-bench":
        from draftscope.analysis.vllm_bench import export_vllm_bench

        count = export_vllm_bench(runs, target)
        print(f"wrote {target}: {count} vLLM benchmark result(s) (vllm bench serve --save-result names)")
    else:
        from draftscope.analysis.export import export_rows

        count = export_rows(runs, fmt, target)
        print(f"wrote {target}: {count} row(s) from {len(runs)} run(s) ({fmt})")
    for found in runs:
        for note in found.notes:
            print(f"note: {found.run_id}: {note}")


def _distinct(runs: list) -> list:
    """The runs, each once: a run named twice would give rows (or MLflow runs) that cannot be told apart."""
    seen: dict[str, Path] = {}
    for found in runs:
        if found.run_id in seen:
            raise UserError(
                f"run {found.run_id} is given twice ({seen[found.run_id]} and {found.path})",
                field="RUN",
                value=str(found.path),
                fix="name each run once",
            )
        seen[found.run_id] = found.path
    return runs


def _output(value: str | None, fmt: str) -> Path:
    suffix = "json" if fmt == "vllm-bench" else fmt
    if not value:
        raise UserError("no output file given", field="--output", fix=f"add --output exports/runs.{suffix}")
    path = Path(value)
    if not path.name or path.name == "..":
        raise UserError(
            "not a file name", field="--output", value=value, fix=f"give a file path, e.g. runs.{suffix}"
        )
    refuse_existing(path, "--output")
    return path


def _mlflow(path, run, tracking_uri, experiment, report, output) -> None:
    from draftscope.analysis.mlflow_log import log_run

    if output is not None:
        raise UserError(
            "MLflow keeps what it logs in its tracking store",
            field="--output",
            value=output,
            fix="drop --output and give --tracking-uri",
        )
    if not tracking_uri:
        raise UserError(
            "no tracking store given", field="--tracking-uri", fix="add --tracking-uri sqlite:///mlflow.db"
        )
    name = experiment or DEFAULT_EXPERIMENT
    folder = Path(report) if report else None  # checked with the run's own files, before anything is logged
    runs = _distinct(load_runs([path, *(run or ())]))
    for found in runs:
        mlflow_id = log_run(found, tracking_uri, name, folder)
        print(f"logged {found.run_id} to {tracking_uri} (experiment {name}, MLflow run {mlflow_id})")


EXPORT_TASKS = [export]
