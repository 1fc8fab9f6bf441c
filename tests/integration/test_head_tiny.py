"""The certified head on the kit-built tiny models, through `invoke benchmark` and `invoke head-study`:

- speculative runs with `--head prefix` and `--head rowwise` produce exactly the dense run's tokens for every
  prompt, in float32 and in bfloat16 (where ties and fallbacks happen), and shadow mode counts 0 disagreements;
- a run with `--capture-head N` leaves its calls, and `head-study` replays them: row-wise vs prefix fallback
  counts printed, a schema-valid study.json written, in a new folder;
- the head outside its domain is refused with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from support import run_invoke, tiny_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    """Six of the example prompts (code, math, prose, chat), to keep six benchmark runs short."""
    from support import ROOT

    data = read_json(ROOT / "examples" / "prompts.json")
    data["prompts"] = data["prompts"][::2]
    path = tmp_path_factory.mktemp("prompts") / "prompts.json"
    path.write_text(json.dumps(data))
    return path


def bench(out: Path, *extra: str, prompts: Path | None = None):
    args = tiny_benchmark(
        "local", "--draft", "tiny", "--repeats", "1", "--max-new-tokens", "48", "--output", str(out), *extra
    )
    if prompts is not None:
        args[args.index("--prompts") + 1] = str(prompts)
    result = run_invoke(*args, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {r["prompt_id"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_certified_heads_reproduce_the_dense_tokens_exactly(tmp_path, dtype, prompts):
    opts = ("--opts", f"dtype={dtype}")
    dense = bench(tmp_path / "dense", *opts, prompts=prompts)
    for policy in ("prefix", "rowwise"):
        run = tmp_path / policy
        records = bench(run, "--head", policy, "--head-shadow", *opts, prompts=prompts)
        for pid, record in records.items():
            assert record["generated_token_ids"] == dense[pid]["generated_token_ids"], (policy, pid)
            assert record["acceptance_lengths"] == dense[pid]["acceptance_lengths"], (policy, pid)
        summary = read_json(run / "summary.json")
        assert problems(summary, "summary") == []
        head = summary["head"]
        assert head["shadow_disagreements"] == 0 and head["shadow_calls"] == head["calls"] > 0
        assert head["certified"] > 0.9 * head["rows"]  # the coarse head does its job, not only falls back
        assert head["dense_calls_prefix"] <= head["dense_calls_rowwise"]
        manifest = read_json(run / "manifest.json")
        assert manifest["config"]["head"]["policy"] == policy


def test_capture_then_head_study(tmp_path):
    run = tmp_path / "captured"
    bench(run, "--capture-head", "30", "--opts", "dtype=bfloat16")
    index = read_json(run / "head" / "capture.json")
    assert len(index["calls"]) == 30 and index["dtype"] == "bfloat16"
    result = run_invoke("head-study", str(run), "--output", str(tmp_path / "study"), "-k", "2", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "dense fallbacks, row-wise rule" in result.stdout and "dense fallbacks, prefix rule" in result.stdout
    )
    study = read_json(tmp_path / "study" / "study.json")
    assert problems(study, "head-study") == []
    assert study["calls"] == 30 and study["disagreements"] == 0
    assert study["fallback_prefix"] <= study["fallback_rowwise"]
    assert (
        study["certified"] + study["uncertified_relevant"] + study["uncertified_irrelevant"] == study["rows"]
    )
    assert (tmp_path / "study" / "fallbacks.png").stat().st_size > 1000
    # The INT8 and INT4 coarse tiers side by side on the same calls (INT4: groups of 96 on hidden size 192).
    assert "coarse tiers side by side" in result.stdout and "INT4 (group 96)" in result.stdout
    tiers = {t["tier"]: t for t in study["tiers"]}
    assert list(tiers) == ["int8", "int4"] and tiers["int4"]["group_size"] == 96
    assert tiers["int8"]["certified"] == study["certified"] and tiers["int4"]["disagreements"] == 0
    assert tiers["int4"]["coarse_bytes"] < tiers["int8"]["coarse_bytes"] < tiers["int8"]["dense_bytes"]
    again = run_invoke("head-study", str(run), "--output", str(tmp_path / "study"))
    assert again.returncode == 2 and "never overwritten" in again.stderr


def test_the_certified_head_needs_the_kits_loop_and_a_draft(tmp_path):
    result = run_invoke(*tiny_benchmark("local", "--head", "prefix", "--output", str(tmp_path / "x")))
    assert result.returncode == 2 and "head.policy" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and not (tmp_path / "x").exists()
