"""`reproduce` without a model: the benchmark itself is replaced by a stand-in that replays the source run's tokens
(the real re-run is the integration test). Checks the frozen config, the prompt hash, the image rules, the output."""

import json
import shutil
from pathlib import Path

import pytest
from test_analysis_synthetic import make_run

from draftscope.analysis.load import load_run
from draftscope.bench import reproduce as R
from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.jsonio import iter_jsonl
from draftscope.runtime import ContainerRuntime

IMAGE = {
    "reference": "localhost/draftscope-transformers:0.1.0",
    "id": "sha256:" + "a" * 64,
    "repo_digests": [],
}


class Replay:
    """Stands in for `run_benchmark`: a new run directory with the source's records (optionally one token changed)."""

    def __init__(self, source: Path, change: tuple[str, int] | None = None):
        self.source, self.change, self.calls = source, change, []

    def __call__(self, config, output, *, argv, say=print, kind="benchmark", notes=()):
        from draftscope.core.config import to_dict
        from draftscope.core.rundir import InputFile, RunDir

        self.calls.append(config)
        frozen = to_dict(config)
        frozen["vllm"] = {k: v for k, v in frozen["vllm"].items() if v is not None}
        run = RunDir.create(
            output,
            kind=kind,
            config=frozen,
            argv=argv,
            inputs=[InputFile("prompts", Path(config.prompts))],
        )
        run.set_status("running")
        with run.records() as out:
            for _, rec in iter_jsonl(self.source / "records.jsonl"):
                if self.change and rec["prompt_id"] == self.change[0]:
                    rec["generated_token_ids"][self.change[1]] += 1
                run.append_record(out, rec)
        summary = json.loads((self.source / "summary.json").read_text())
        run.write_summary({**summary, "run_id": Path(output).name})
        return run.complete()


@pytest.fixture
def source(tmp_path):
    return make_run(tmp_path / "src", seed=1)


def test_the_frozen_config_uses_the_runs_own_prompt_copy(source, monkeypatch):
    monkeypatch.chdir(source.parent)
    config = R.frozen_config(load_run(source))
    assert config.prompts == "src/inputs/prompts.json" and config.repeats == 2 and config.max_new_tokens == 12


def test_a_changed_prompt_copy_is_refused(source):
    copy = source / "inputs" / "prompts.json"
    copy.write_text(copy.read_text().replace("Python", "Rust", 1))
    with pytest.raises(UserError, match="no longer has the hash"):
        R.frozen_config(load_run(source))


def test_reproduction_with_identical_tokens_writes_a_valid_comparison(tmp_path, source, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay = Replay(source)
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", replay)
    said = []
    doc, path = R.reproduce(source, tmp_path / "again", argv=["test"], resamples=200, say=said.append)
    assert (
        path == Path("comparisons/src__again.json")
        and schema.problems(json.loads(path.read_text()), "comparison") == []
    )
    assert doc["kind"] == "reproduction" and doc["reproduction"]["tokens_identical"] is True
    assert doc["reproduction"]["image_check"] == "skipped_local_runtime" and said == [R.LOCAL_NOTE]
    assert doc["tokens"]["compared"] == 24 and doc["median_ratio"] == pytest.approx(1.0)
    assert replay.calls[0].repeats == 2


def test_a_token_difference_is_reported(tmp_path, source, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", Replay(source, ("math-arith", 3)))
    doc, _ = R.reproduce(source, tmp_path / "again", argv=["test"], resamples=100, say=lambda _: None)
    assert doc["reproduction"]["tokens_identical"] is False
    assert doc["tokens"]["first_mismatch"]["prompt_id"] == "math-arith"
    assert doc["tokens"]["first_mismatch"]["position"] == 3


def test_an_existing_comparison_is_refused_before_running(tmp_path, source, monkeypatch):
    replay = Replay(source)
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", replay)
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(UserError, match="already exists"):
        R.reproduce(
            source, tmp_path / "again", comparison=tmp_path / "c.json", argv=["t"], say=lambda _: None
        )
    assert replay.calls == [] and not (tmp_path / "again").exists()


def test_a_partial_run_is_not_reproduced(tmp_path):
    partial = make_run(tmp_path / "p", status="timed_out")
    with pytest.raises(UserError, match="not completed"):
        R.reproduce(partial, tmp_path / "again", argv=["t"], say=lambda _: None)


def test_image_drift_is_refused_unless_allowed_and_then_recorded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = make_run(tmp_path / "dock", seed=2, image=IMAGE)
    now = {**IMAGE, "id": "sha256:" + "b" * 64}
    monkeypatch.setattr(ContainerRuntime, "image_facts", lambda self, image: dict(now))
    replay = Replay(source)
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", replay)
    with pytest.raises(UserError) as info:
        R.reproduce(source, tmp_path / "again", argv=["t"], say=lambda _: None)
    assert "--allow-image-drift" in info.value.render() and "bbbb" in info.value.render()
    assert replay.calls == [] and not (tmp_path / "again").exists()
    doc, _ = R.reproduce(
        source, tmp_path / "again", allow_image_drift=True, argv=["t"], resamples=100, say=lambda _: None
    )
    assert doc["reproduction"]["image_check"] == "drift_allowed"
    assert doc["reproduction"]["images"][0]["same"] is False
    assert any(n.startswith("image drift allowed: step benchmark") for n in doc["notes"])


def test_the_same_image_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = make_run(tmp_path / "dock", seed=2, image=IMAGE)
    monkeypatch.setattr(ContainerRuntime, "image_facts", lambda self, image: dict(IMAGE))
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", Replay(source))
    doc, _ = R.reproduce(source, tmp_path / "again", argv=["t"], resamples=100, say=lambda _: None)
    assert doc["reproduction"]["image_check"] == "matched"


def test_reproducing_twice_into_the_same_output_is_refused(tmp_path, source, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(source, tmp_path / "again")
    replay = Replay(source)
    monkeypatch.setattr("draftscope.bench.supervisor.run_benchmark", replay)
    with pytest.raises(UserError, match="already exists"):
        R.reproduce(source, tmp_path / "again", argv=["t"], say=lambda _: None)
    assert replay.calls == []


@pytest.mark.parametrize(
    ("recorded", "current"),
    [
        ([], ["r.io/a/t@sha256:" + "1" * 64]),  # run made before the push; reproduced from the pulled image
        (["localhost/t@sha256:" + "2" * 64], ["localhost/t@sha256:" + "4" * 64]),  # each engine's own digests
        (["r.io/a/t@sha256:" + "1" * 64], ["r.io/a/t@sha256:" + "3" * 64]),  # the same image pushed again
    ],
)
def test_an_image_is_the_same_by_its_reference_and_id_whatever_its_repository_digests(recorded, current):
    old = {**IMAGE, "repo_digests": recorded}
    assert R._same_image(old, {**IMAGE, "repo_digests": current}) is True
    assert R._same_image(old, {**IMAGE, "id": "sha256:" + "c" * 64, "repo_digests": current}) is False
    assert R._same_image(old, {**IMAGE, "reference": "localhost/other:1", "repo_digests": current}) is False
