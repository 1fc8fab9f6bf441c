"""`invoke export --format mlflow`: runs logged to a real local MLflow store (SQLite, MLflow's own local backend)
and read back with MLflow's own client: parameters, metrics, tags, status, times and artifacts."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime

import pytest
from test_analysis_export import cli
from test_analysis_synthetic import make_run

from draftscope.analysis import mlflow_log
from draftscope.analysis.load import load_run
from draftscope.analysis.report import write_report
from draftscope.core.errors import MissingDependency, UserError

# The export extra's MLflow is in `.venv` (`make setup`); the vLLM tier's `.venv-train` collects every module and
# has none.
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

pytestmark = pytest.mark.slow  # the store's schema migrations take seconds


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh SQLite tracking store; MLflow puts a new experiment's artifacts under ./mlruns, so in here."""
    root = tmp_path_factory.mktemp("mlflow")
    runs = root / "runs"
    make_run(runs / "spec", seed=2, draft=True, repeats=2)
    make_run(runs / "partial", seed=3, status="timed_out", repeats=1)
    write_report([load_run(runs / "spec")], root / "report")
    before = os.getcwd()
    os.chdir(root)
    try:
        uri = f"sqlite:///{root / 'mlflow.db'}"
        code, stdout, stderr = cli(
            "export", str(runs / "spec"), "--run", str(runs / "partial"), "--format", "mlflow",
            "--tracking-uri", uri, "--experiment", "kit", "--report", str(root / "report"),
        )  # fmt: skip
        yield {"root": root, "runs": runs, "uri": uri, "code": code, "stdout": stdout, "stderr": stderr}
    finally:
        os.chdir(before)


def logged(store, run_id):
    client = MlflowClient(tracking_uri=store["uri"])
    experiment = client.get_experiment_by_name("kit")
    found = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`draftscope.run_id` = '{run_id}'"
    )
    return client, found


def millis(stamp):
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def test_the_runs_are_logged_and_said_so(store):
    assert store["code"] == 0, store["stderr"]
    lines = store["stdout"].splitlines()
    assert [line.split()[1] for line in lines] == ["spec", "partial"]
    assert all("experiment kit, MLflow run " in line for line in lines)


def test_params_metrics_and_tags_read_back_with_mlflow_s_client(store):
    run = load_run(store["runs"] / "spec")
    client, found = logged(store, "spec")
    assert len(found) == 1
    data = client.get_run(found[0].info.run_id).data
    assert data.params["backend"] == "transformers" and data.params["config_name"] == "tiny-cpu"
    assert data.params["target"] == run.target and data.params["draft"] == run.draft
    assert data.params["draft_tokens"] == "4" and data.params["repeats"] == "2"
    assert data.params["prompts_sha256"] == next(
        i["sha256"] for i in run.manifest["inputs"] if i["name"] == "prompts"
    )
    assert data.params == mlflow_log.params(run)
    overall = json.loads((store["runs"] / "spec" / "summary.json").read_text())["overall"]
    assert data.metrics["request_tok_s.median"] == pytest.approx(overall["request_tok_s"]["median"])
    assert data.metrics["decode_tok_s.max"] == pytest.approx(overall["decode_tok_s"]["max"])
    ledger = overall["acceptance"]
    assert (
        data.metrics["acceptance.mean_pooled"] == pytest.approx(ledger["mean_pooled"]) == pytest.approx(3.0)
    )
    assert data.metrics["acceptance.rate"] == pytest.approx(0.5)
    assert data.metrics["acceptance.proposed_drafts"] == ledger["proposed_drafts"]
    assert [data.metrics[f"acceptance.per_position.{i}"] for i in (1, 2, 3, 4)] == pytest.approx(
        [1, 0.75, 0.25, 0]
    )
    assert data.metrics["records"] == len(run.records) and data.metrics["greedy_agreement"] == 1.0
    kit = run.manifest["kit"]
    assert data.tags["draftscope.run_kit_version"] == kit["version"]
    assert data.tags["draftscope.run_kit_commit"] == str(kit["git_commit"])
    assert data.tags["mlflow.runName"] == "spec"


def test_a_summary_without_the_ledger_gets_the_ledger_of_its_records(store):
    run = load_run(store["runs"] / "spec")
    del run.summary["overall"]["acceptance"]  # as summaries written before the ledger existed
    figures = mlflow_log.metrics(run)
    assert figures["acceptance.mean_pooled"] == pytest.approx(3.0) and figures["acceptance.steps"] == 4 * len(
        run.records
    )


def test_status_and_times_are_the_kit_run_s(store):
    client, found = logged(store, "spec")
    info = client.get_run(found[0].info.run_id).info
    manifest = load_run(store["runs"] / "spec").manifest
    assert info.status == "FINISHED"
    assert info.start_time == millis(manifest["started_at"]) and info.end_time == millis(
        manifest["finished_at"]
    )
    client, found = logged(store, "partial")
    assert client.get_run(found[0].info.run_id).info.status == "KILLED"  # timed out


def test_the_manifest_summary_and_report_are_artifacts_byte_for_byte(store, tmp_path):
    client, found = logged(store, "spec")
    run_id = found[0].info.run_id
    assert sorted(a.path for a in client.list_artifacts(run_id)) == [
        "manifest.json",
        "report.html",
        "summary.json",
    ]
    for name, source in (
        ("manifest.json", store["runs"] / "spec" / "manifest.json"),
        ("summary.json", store["runs"] / "spec" / "summary.json"),
        ("report.html", store["root"] / "report" / "report.html"),
    ):
        local = client.download_artifacts(run_id, name, str(tmp_path))
        assert open(local, "rb").read() == source.read_bytes(), name  # noqa: SIM115


def test_a_run_already_logged_is_refused_and_not_logged_twice(store):
    code, _, stderr = cli(
        "export", str(store["runs"] / "spec"), "--format", "mlflow", "--tracking-uri", store["uri"],
        "--experiment", "kit", cwd=store["root"],
    )  # fmt: skip
    _, found = logged(store, "spec")
    assert code == 2 and "already logged to experiment 'kit' as MLflow run" in stderr
    assert found[0].info.run_id in stderr and "fix:" in stderr
    assert len(found) == 1


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("ftp://nowhere", "unsupported URI 'ftp://nowhere'"),
        ("plain-folder", "filesystem tracking backend"),  # MLflow's file store, in maintenance upstream
    ],
)
def test_a_tracking_uri_mlflow_refuses_is_one_line_naming_the_option(store, uri, said):
    code, _, stderr = cli(
        "export", str(store["runs"] / "spec"), "--format", "mlflow", "--tracking-uri", uri, cwd=store["root"]
    )
    line = stderr.strip()
    assert code == 2 and "\n" not in line and "Traceback" not in line, stderr
    assert line.startswith("error: --tracking-uri: MLflow refused the tracking store") and said in line
    assert "fix: give a tracking URI MLflow takes" in line


def test_a_report_that_is_not_one_is_refused_before_anything_is_logged(store, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    code, _, stderr = cli(
        "export", str(store["runs"] / "partial"), "--format", "mlflow", "--tracking-uri", store["uri"],
        "--experiment", "other", "--report", str(tmp_path / "notes.txt"), cwd=store["root"],
    )  # fmt: skip
    assert code == 2 and "--report: not a report" in stderr, stderr
    assert MlflowClient(tracking_uri=store["uri"]).get_experiment_by_name("other") is None


def test_a_failure_half_way_marks_the_mlflow_run_failed_and_names_it(store, monkeypatch):
    def full_disk(self, run_id, local_path, artifact_path=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MlflowClient, "log_artifact", full_disk)
    with pytest.raises(UserError) as caught:
        mlflow_log.log_run(load_run(store["runs"] / "partial"), store["uri"], "halfway")
    client = MlflowClient(tracking_uri=store["uri"])
    (half,) = client.search_runs([client.get_experiment_by_name("halfway").experiment_id])
    assert half.info.status == "FAILED"
    assert f"MLflow run {half.info.run_id} is marked FAILED" in str(caught.value)
    assert "No space left on device" in str(caught.value) and f"delete MLflow run {half.info.run_id}" in str(
        caught.value
    )


def test_a_missing_mlflow_names_the_extra_to_install(store, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(MissingDependency) as caught:
        mlflow_log.log_run(load_run(store["runs"] / "spec"), store["uri"], "kit")
    assert "draftscope[export]" in str(caught.value)


def test_the_cli_names_the_missing_extra_before_reading_any_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    code, _, stderr = cli(
        "export", str(tmp_path / "no-run-here"), "--format", "mlflow", "--tracking-uri", "sqlite:///m.db"
    )
    assert code == 2 and "'mlflow' is not installed" in stderr and "draftscope[export]" in stderr, stderr
