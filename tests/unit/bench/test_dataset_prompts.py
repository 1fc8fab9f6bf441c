"""The shipped prompt sets (`draftscope.core.datasets`) and how `--dataset` / `--max-prompts` reach a plan: the
shipped file's recorded SHA-256s, the deterministic subset, and the clear errors."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from draftscope.bench import options
from draftscope.bench.plan import plan_benchmark, prompts_for
from draftscope.core import datasets
from draftscope.core.errors import UserError
from draftscope.core.jsonio import sha256_file
from draftscope.core.presets import load_experiment
from draftscope.core.schema import problems

from support import ROOT, run_invoke

TINY = {"preset": "tiny", "device": "cpu", "runtime": "local"}


def test_shipped_mt_bench_matches_its_recorded_hashes_and_upstream():
    ship = datasets.shipped("mt-bench")
    assert sha256_file(ship.path) == ship.sha256 == datasets.SHIPPED["mt-bench"][1]
    doc = json.loads(ship.path.read_text(encoding="utf-8"))
    assert problems(doc, "prompts") == [] and len(doc["prompts"]) == ship.prompts == 80
    up = datasets.UPSTREAM["mt-bench"]
    assert doc["source"] == {
        "format": "mt-bench",
        "repository": up.repository,
        "path": up.path,
        "commit": up.commit,
        "licence": up.licence,
        "file": "question.jsonl",
        "sha256": up.sha256,
        "turns": "first",
        "later_turns_dropped": 80,
    }
    assert len(up.commit) == 40 and len(up.sha256) == 64
    # Package data: it travels in the wheel with the rest of src/draftscope (pyproject's wheel target).
    assert ship.path.is_relative_to(ROOT / "src" / "draftscope")


def test_a_changed_shipped_file_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "mt-bench.json"
    shutil.copy(datasets.shipped("mt-bench").path, copy)
    copy.write_bytes(copy.read_bytes().replace(b"Hawaii", b"Hawaij"))
    monkeypatch.setattr(datasets, "ASSETS", tmp_path)
    with pytest.raises(UserError, match="differs from the SHA-256"):
        datasets.shipped("mt-bench")


def test_unknown_and_unshipped_names_say_what_exists_and_why():
    with pytest.raises(UserError, match="did you mean 'mt-bench'") as caught:
        datasets.shipped("mt-bnch")
    assert caught.value.field == "--dataset"
    with pytest.raises(UserError, match=r"not shipped: .*other datasets"):
        datasets.shipped("spec-bench")
    with pytest.raises(UserError, match="evaluation licence"):
        datasets.shipped("speed-bench")


def test_dataset_and_subset_reach_the_plan():
    config = options.experiment_config(dataset="mt-bench", max_prompts="3", **TINY)
    assert (config.dataset, config.max_prompts) == ("mt-bench", 3)
    plan = plan_benchmark(config)
    assert (plan.prompts.count, plan.prompts.total, plan.prompts.dataset) == (3, 80, "mt-bench")
    assert plan.prompts.sha256 == datasets.shipped("mt-bench").sha256
    assert plan.prompts.source["commit"] == datasets.UPSTREAM["mt-bench"].commit
    ids = [p["id"] for p in json.loads(datasets.shipped("mt-bench").path.read_text())["prompts"]]
    assert datasets.selected(ids, 3) == ["81", "82", "83"] == datasets.selected(ids, 3)  # first 3, file order
    assert datasets.selected(ids, None) == ids and datasets.selected(ids, 500) == ids


def test_max_prompts_works_on_any_prompt_file():
    plan = plan_benchmark(options.experiment_config(max_prompts=2, **TINY))
    assert (plan.prompts.count, plan.prompts.total, plan.prompts.dataset) == (2, 12, None)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_max_prompts_is_named(value):
    with pytest.raises(UserError) as caught:
        options.experiment_config(max_prompts=value, **TINY)
    assert caught.value.field == "--max-prompts"


def test_prompts_and_dataset_together_name_both_flags_and_the_fix():
    with pytest.raises(UserError) as caught:
        options.experiment_config(prompts="examples/prompts.json", dataset="mt-bench", **TINY)
    text = str(caught.value)
    assert "--prompts and --dataset" in text and "drop --prompts" in text and "drop --dataset" in text


def test_a_reproduction_may_point_prompts_at_the_sets_copy_but_not_at_another_file(tmp_path):
    """`invoke reproduce` points `prompts` at the run's copy: the same bytes pass; another file is refused."""
    copy = tmp_path / "mt-bench.json"
    shutil.copy(datasets.shipped("mt-bench").path, copy)
    same = load_experiment("tiny-cpu", {"dataset": "mt-bench", "prompts": str(copy), "max_prompts": 2})
    assert prompts_for(same).sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    other = load_experiment(
        "tiny-cpu", {"dataset": "mt-bench", "prompts": str(ROOT / "examples" / "prompts.json")}
    )
    with pytest.raises(UserError, match="not the shipped set 'mt-bench'"):
        prompts_for(other)
    # `--opts dataset=mt-bench` alone: the preset's default prompts are replaced by the set's file
    assert prompts_for(load_experiment("tiny-cpu", opts=["dataset=mt-bench"])).count == 80


def test_invoke_datasets_lists_and_import_converts_then_refuses_to_overwrite(tmp_path):
    listed = run_invoke("datasets", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["mt-bench"]["shipped"] and rows["mt-bench"]["prompts"] == 80
    assert rows["mt-bench"]["commit"] == datasets.UPSTREAM["mt-bench"].commit
    assert not rows["spec-bench"]["shipped"] and rows["spec-bench"]["not_shipped"]
    sample = ROOT / "tests" / "fixtures" / "datasets" / "spec_bench_question.jsonl"
    out = tmp_path / "spec.json"
    args = ("datasets.import", str(sample), "--format", "spec-bench", "--output", str(out))
    done = run_invoke(*args)
    assert done.returncode == 0, done.stderr
    assert "4 prompts" in done.stdout and "1 later turns dropped" in done.stdout
    assert problems(json.loads(out.read_text()), "prompts") == []
    again = run_invoke(*args)
    assert again.returncode != 0 and "never overwritten" in again.stderr
