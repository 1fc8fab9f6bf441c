"""The Transformers backend on CUDA, as a user runs it (`invoke benchmark --device cuda --runtime local`): the
kit-built tiny target and draft on the GPU, plain and speculative, and the GPU memory cap (`--memory-fraction`,
`torch.cuda.set_per_process_memory_fraction`). Run by tests/gpu/gpu_check.sh on a lent GPU machine; skipped
elsewhere (marker `gpu`). Written against the backend's code and never yet run on a GPU: the first GPU day runs it.

What it proves there: the backend loads both models on CUDA and the run completes and validates with the GPU in its
hardware facts; the speculative loop is exact on CUDA (greedy tokens equal the plain run's, same dtype); and the cap
is applied, not just recorded: a fraction too small for the tiny model ends the run as out of memory.
"""

from __future__ import annotations

import json

import pytest

from support import run_invoke, tiny_benchmark

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

ARGS = (
    "--max-prompts",
    "4",
    "--repeats",
    "2",
    "--warmups",
    "1",
    "--max-new-tokens",
    "32",
    "--dtype",
    "float32",
)


def _cuda(*extra: str) -> list[str]:
    return tiny_benchmark("local", *ARGS, *extra, device="cuda")


def _records(run):
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda")
    out = {}
    for name, extra in (("plain", ()), ("speculative", ("--draft", "tiny"))):
        proc = run_invoke(*_cuda(*extra), "--output", str(root / name), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out[name] = root / name
    return out


def test_the_runs_complete_validate_and_record_the_gpu(runs):
    for run in runs.values():
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["status"] == "completed"
        assert manifest["hardware"]["device"] == "cuda" and manifest["hardware"]["gpu"]["name"], manifest[
            "hardware"
        ]
        assert run_invoke("validate", str(run)).returncode == 0
        summary = json.loads((run / "summary.json").read_text())
        assert summary["greedy_agreement"] is True, summary["disagreements"]


def test_the_speculative_loop_is_exact_on_cuda(runs):
    plain = {(r["prompt_id"], r["repeat"]): r["generated_token_ids"] for r in _records(runs["plain"])}
    spec = _records(runs["speculative"])
    assert len(spec) == len(plain) == 8
    for r in spec:
        assert r["generated_token_ids"] == plain[(r["prompt_id"], r["repeat"])], r["prompt_id"]
        assert r["acceptance_lengths"], "a speculative record counts its accepted drafts"


def test_the_memory_cap_is_applied(tmp_path):
    run = tmp_path / "capped"
    proc = run_invoke(*_cuda("--memory-fraction", "0.00001"), "--output", str(run), timeout=600)
    assert proc.returncode != 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "out of memory" in manifest["reason"], manifest["reason"]
