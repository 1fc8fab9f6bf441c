"""A run whose engine changes the target's greedy output on one repeat is caught, end to end (issue 33, item 6).

Greedy decoding with exact verification repeats itself: a speculative engine that changed one token of the target's
output on the second repeat is the failure the summary's `greedy_agreement` exists to catch. Here a real tiny run
(the Transformers backend, the kit-built tiny target and draft, speculative, on the CPU) has the benchmark worker's
fault injection change the token at one position of every generation of repeat 1
(`DRAFTSCOPE_FAILPOINT=repeat:1:change-token:P`, bench/worker.py); an honest plain run of the same prompts is the
base. The disagreement must show, with its prompt, repeat and first diverging position, in the run's summary, in
`invoke analyze`'s table and report, and in `invoke compare` (the pair's token check and the candidate's own
repeats); the honest run must agree with itself. The manifest notes that fault injection was active.
"""

from __future__ import annotations

import json

import pytest

from draftscope.bench.worker import FAILPOINT
from draftscope.core.validate import validate_run

from support import needs_tiny_files, run_invoke, tiny_benchmark

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    needs_tiny_files(),
]

POSITION = 5  # well inside the 12 tokens each generation is held to (--fixed-tokens)
WIDE = {"COLUMNS": "400"}
ARGS = ("--max-prompts", "3", "--repeats", "2", "--warmups", "0", "--fixed-tokens", "12")


def _run(out, *extra, env=None):
    proc = run_invoke(*tiny_benchmark("local", *ARGS, *extra), "--output", str(out), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("disagree")
    base, changed = root / "base", root / "changed"
    _run(base)
    _run(changed, "--draft", "tiny", env={FAILPOINT: f"repeat:1:change-token:{POSITION}"})
    return base, changed


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def test_the_summary_names_every_changed_record_at_its_position(runs):
    base, changed = runs
    assert _summary(base)["greedy_agreement"] is True
    assert _summary(base)["disagreements"] == []
    summary = _summary(changed)
    assert summary["greedy_agreement"] is False
    records = [json.loads(line) for line in (changed / "records.jsonl").read_text().splitlines()]
    prompts = sorted({r["prompt_id"] for r in records})
    assert len(prompts) == 3 and len(records) == 6
    # Exactly the repeat-1 record of each prompt, each at the injected position: the repeat-0 records are the
    # reference and agree with the honest run token for token.
    assert sorted(summary["disagreements"], key=lambda d: d["prompt_id"]) == [
        {"prompt_id": p, "repeat": 1, "first_diverging_position": POSITION} for p in prompts
    ]
    base_records = [json.loads(line) for line in (base / "records.jsonl").read_text().splitlines()]
    honest = {(r["prompt_id"], r["repeat"]): r["generated_token_ids"] for r in base_records}
    for r in records:
        ids = honest[(r["prompt_id"], r["repeat"])]
        if r["repeat"] == 0:
            assert r["generated_token_ids"] == ids  # the speculative run is exact where nothing was injected
        else:
            diff = [i for i, (a, b) in enumerate(zip(ids, r["generated_token_ids"], strict=True)) if a != b]
            assert diff == [POSITION]


def test_the_run_stays_valid_and_the_manifest_says_a_fault_was_injected(runs):
    _, changed = runs
    report = validate_run(changed, final=True)
    assert report.ok, report.first_failure()
    manifest = json.loads((changed / "manifest.json").read_text())
    assert any(f"{FAILPOINT}=repeat:1:change-token:{POSITION}" in note for note in manifest.get("notes", []))


def test_analyze_shows_the_disagreement_in_the_table_and_the_report(runs, tmp_path):
    base, changed = runs
    report_dir = tmp_path / "report"
    # a terminal wide enough that the table's cells are not wrapped
    proc = run_invoke(
        "analyze", str(base), "--run", str(changed), "--report", str(report_dir), env=WIDE, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "no: 3 disagreement(s); first" in text  # the terminal's cell may wrap; the report's line does not
    report = " ".join((report_dir / "report.md").read_text().split())
    assert "no: 3 disagreement(s); first" in report and f"repeat 1 at position {POSITION}" in report


def test_compare_reports_the_pair_and_the_candidates_own_repeats(runs, tmp_path):
    base, changed = runs
    out = tmp_path / "cmp.json"
    proc = run_invoke(
        "compare", str(base), str(changed), "--output", str(out), "--resamples", "200", env=WIDE, timeout=300
    )
    # written, and the exit status says the tokens differ where they must agree
    assert proc.returncode == 1 and out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    tokens = doc["tokens"]
    # The pair: each repeat-1 record differs from the base's repeat 1 at the position, the repeat-0 ones agree.
    assert tokens["compared"] == 6 and tokens["identical"] == 3
    assert {(m["candidate_repeat"], m["position"]) for m in tokens["mismatches"]} == {(1, POSITION)}
    # Each run against itself.
    assert tokens["within_run"]["base"] == {"agree": True, "disagreements": 0, "first": None}
    own = tokens["within_run"]["candidate"]
    assert own["agree"] is False and own["disagreements"] == 3
    assert own["first"]["repeat"] == 1 and own["first"]["first_diverging_position"] == POSITION
    text = " ".join(proc.stdout.split())
    assert "candidate's own repeats DISAGREE" in text and f"at position {POSITION}" in text
    assert "a MISMATCH where tokens must agree" in text
