"""`invoke benchmark --dataset mt-bench` on the tiny preset (CPU, local runtime), a few prompts, then `invoke
validate` (issue #20 item 4): the run records the set, its upstream commit and licence, and the subset it took."""

import json

import pytest

from draftscope.core import datasets

from support import run_invoke

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real benchmark of the tiny models

ARGS = ("benchmark", "--backend", "transformers", "--runtime", "local", "--preset", "tiny", "--device", "cpu")


def test_mt_bench_on_the_tiny_preset_runs_validates_and_records_its_source(tmp_path):
    out = tmp_path / "mtb"
    sizes = ("--dataset", "mt-bench", "--max-prompts", "2", "--repeats", "1", "--max-new-tokens", "8")
    result = run_invoke(*ARGS, *sizes, "--output", str(out), timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    checked = run_invoke("validate", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert (manifest["config"]["dataset"], manifest["config"]["max_prompts"]) == ("mt-bench", 2)
    (entry,) = manifest["inputs"]
    ship, up = datasets.shipped("mt-bench"), datasets.UPSTREAM["mt-bench"]
    assert entry["sha256"] == ship.sha256
    assert (entry["source"]["repository"], entry["source"]["commit"], entry["source"]["licence"]) == (
        up.repository,
        up.commit,
        up.licence,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["records"], summary["prompts_total"], summary["prompts_completed"]) == (2, 2, 2)
    ids = [json.loads(line)["prompt_id"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert ids == ["81", "82"]  # the first two questions, in the file's order
