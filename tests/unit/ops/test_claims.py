"""One command per claim (issue "The reviewer's path", acceptance 2): every claim of research/claims.yaml names a
check whose commands are real tasks with real options; `claims.reproduce` runs them, reads each figure from their
outputs and writes a schema-valid verdict that is never overwritten; a claim whose hardware is missing is not run;
historical claims stay labelled historical."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_analysis_synthetic import make_run

from draftscope.cli import ns
from draftscope.core import schema
from draftscope.core.hardware import Gpu
from draftscope.core.images import IMAGES
from draftscope.ops import claims as C

from support import ROOT

CLAIMS = C.load_claims(ROOT)


def task(name):
    found = ns
    for part in name.split("."):
        found = found.collections[part] if part in found.collections else found.tasks[part]
    return found


def test_every_claim_names_its_check_and_every_command_is_a_real_task_with_real_options():
    assert {c["origin"] for c in CLAIMS} == {"historical", "kit"}
    for claim in CLAIMS:
        check = claim["check"]
        if "none" in check:
            assert claim["origin"] == "historical" and len(check["none"]) > 40
            continue
        assert set(check["images"]) <= set(IMAGES)
        assert check["minutes"] > 0 and check["figures"]
        for command in C.argvs(check):
            found = task(command[1])
            flags = {f"--{a.name.replace('_', '-')}" for a in found.get_arguments()}
            used = {w for w in command[2:] if w.startswith("--")}
            assert used <= flags, (claim["id"], command[1], sorted(used - flags))
        outputs = " ".join(w for cmd in C.argvs(check) for w in cmd)
        for figure in check["figures"]:  # every figure is read from something a command writes
            assert figure["file"].split("/")[1] in outputs, (claim["id"], figure["file"])


def test_the_cpu_claims_are_the_kits_and_cite_committed_evidence():
    cpu = [c for c in CLAIMS if c["check"].get("hardware", {}).get("class") == "cpu"]
    assert len(cpu) >= 4 and all(c["origin"] == "kit" and c["status"] == "reproduced" for c in cpu)
    for claim in cpu:
        assert claim["evidence"] and all((ROOT / "research" / e).exists() for e in claim["evidence"])
        assert all(
            "--runtime" in cmd and "docker" in cmd for cmd in C.argvs(claim["check"]) if cmd[1] == "benchmark"
        )
    assert all(c["status"] == "reported" for c in CLAIMS if c["origin"] == "historical")


def claim_on(tmp_path, *, expected=24, hardware=None, command=None, origin="kit"):
    a, b = make_run(tmp_path / "a", seed=1), make_run(tmp_path / "b", seed=2)
    return {
        "id": "synthetic",
        "origin": origin,
        "provenance": {"reported_by": "someone", "hardware": "one GPU", "reproduced_here": False},
        "check": {
            "hardware": hardware or {"class": "cpu", "description": "any CPU"},
            "images": [],
            "minutes": 0.5,
            "commands": [command or ["invoke", "compare", str(a), str(b), "--output", "{work}/c.json"]],
            "figures": [
                {
                    "quantity": "identical pairs",
                    "file": "{work}/c.json",
                    "path": "tokens.identical",
                    "expected": expected,
                },
                {
                    "quantity": "decision",
                    "file": "{work}/c.json",
                    "path": "verdict.decision",
                    "expected": "not_admitted",
                },
            ],
        },
    }


def context(tmp_path, gpus=()):
    return C.Context(
        root=ROOT,
        verdicts=tmp_path / "verdicts",
        python=sys.executable,
        gpus=lambda: list(gpus),
        say=lambda _: None,
    )


def test_a_claim_is_reproduced_not_reproduced_or_failed_and_no_verdict_is_overwritten(tmp_path):
    doc, path = C.reproduce(claim_on(tmp_path), context(tmp_path))
    assert doc["verdict"] == "reproduced" and [f["measured"] for f in doc["figures"]] == [24, "not_admitted"]
    assert doc["commands"][0]["exit_code"] == 0 and (path.parent / doc["commands"][0]["log"]).is_file()
    schema.check(json.loads(path.read_text()), "claim-verdict", str(path))
    wrong, path2 = C.reproduce(claim_on(tmp_path / "w", expected=23), context(tmp_path))
    assert wrong["verdict"] == "not_reproduced" and path2 != path and path.is_file()
    assert wrong["reason"] == "identical pairs: 24 against 23" and wrong["figures"][0]["ok"] is False
    broken = claim_on(
        tmp_path / "x", command=["invoke", "compare", str(tmp_path / "nope"), str(tmp_path / "nope")]
    )
    failed, _ = C.reproduce(broken, context(tmp_path))
    assert failed["verdict"] == "failed" and "exited with" in failed["reason"] and failed["figures"] == []
    assert C.latest(tmp_path / "verdicts", "synthetic")["verdict"] == "failed"  # the newest


WAITER = """#!/bin/sh
# stands in for `python -m invoke NAME`: writes NAME, then waits (at most 10 s) for the other name to appear;
# waiting for `never` fails at once, as the wait would after 10 s
shift 2
touch "$WORK/$1"
[ "$2" = never ] && exit 3
for _ in $(seq 100); do [ -e "$WORK/$2" ] && exit 0; sleep 0.1; done
exit 3
"""


def test_commands_together_start_at_once_and_a_failure_in_a_step_fails_the_check(tmp_path, monkeypatch):
    # Each stand-in waits for the other: run one after the other, the first would give up after 10 s and fail.
    fake = tmp_path / "python"
    fake.write_text(WAITER)
    fake.chmod(0o755)
    monkeypatch.setenv("WORK", str(tmp_path))
    claim = claim_on(tmp_path)
    pair = [["invoke", "a", "b"], ["invoke", "b", "a"]]
    claim["check"].update(commands=pair, together=[[1, 2]])
    claim["check"]["figures"] = [{"quantity": "q", "file": "{work}/none.json", "path": "x", "expected": 1}]
    ctx = context(tmp_path)
    ctx.python = str(fake)
    doc, _ = C.reproduce(claim, ctx)
    assert [c["exit_code"] for c in doc["commands"]] == [0, 0]
    assert [c["log"] for c in doc["commands"]] == ["logs/01-a.log", "logs/02-b.log"]
    assert doc["verdict"] == "failed" and doc["reason"] == "{work}/none.json was not written"
    claim["check"]["commands"] = [["invoke", "c", "never"], ["invoke", "d", "c"], ["invoke", "e", "f"]]
    doc, _ = C.reproduce(claim, ctx)
    assert [c["exit_code"] for c in doc["commands"]] == [3, 0]  # the third never started
    assert doc["verdict"] == "failed" and doc["reason"].startswith("`invoke c` exited with 3")
    three = {"commands": [["invoke", "x"]] * 4, "together": [[2, 3]]}
    assert [len(step) for step in C.steps(three)] == [1, 2, 1] and len(C.argvs(three)) == 4
    shape = {"hardware": {"class": "cpu", "description": "x"}, "images": [], "minutes": 1, "figures": []}
    for together, where in (([[2, 4]], "[0]"), ([[3, 4, 5]], "[0]"), ([[1, 2], [2, 3]], "[1]")):
        with pytest.raises(Exception, match=r"consecutive|one group") as info:
            C._check_shape({**shape, **three, "together": together}, "$.c")
        assert info.value.field == f"$.c.together{where}"


def test_a_claim_needing_a_gpu_is_not_run_without_one_and_runs_with_it(tmp_path):
    hardware = {"class": "gpu", "gpu": "A100-SXM4-80GB", "description": "one NVIDIA A100-SXM4-80GB"}
    doc, _ = C.reproduce(claim_on(tmp_path, hardware=hardware, origin="historical"), context(tmp_path))
    assert (doc["verdict"], doc["reason"], doc["commands"]) == (
        "needs_hardware",
        "needs one NVIDIA A100-SXM4-80GB",
        [],
    )
    a100 = Gpu(0, "NVIDIA A100-SXM4-80GB", None, (8, 0), 81920, 81000, "580.1")
    ran, _ = C.reproduce(
        claim_on(tmp_path / "g", hardware=hardware, origin="historical"), context(tmp_path, [a100])
    )
    assert ran["verdict"] == "reproduced" and ran["hardware"]["found"] == "NVIDIA A100-SXM4-80GB"
    shown = C.label(
        {"origin": "historical", "provenance": {"reported_by": "them", "hardware": "one A100"}}, ran
    )
    assert shown == "reproduced (historical, reported by them)"


def test_figures_from_json_lines_and_wildcards_need_a_reduce(tmp_path):
    (tmp_path / "r.jsonl").write_text(
        "\n".join(json.dumps({"x": {"ok": v, "n": n}}) for v, n in [(True, 2), (False, 5)])
    )
    (tmp_path / "s.json").write_text(json.dumps({"per": {"a": {"m": 3.0}, "b": {"m": 1.5}}, "l": [[7]]}))
    f = {"file": "{work}/r.jsonl", "path": "x.ok"}
    assert C.measure({**f, "reduce": "all"}, tmp_path) == (False, None)
    assert C.measure({**f, "reduce": "any"}, tmp_path) == (True, None)
    assert C.measure({"file": "{work}/r.jsonl", "path": "x.n", "reduce": "median"}, tmp_path) == (3.5, None)
    assert "needs a `reduce`" in C.measure(f, tmp_path)[1]
    assert C.measure({"file": "{work}/s.json", "path": "per.*.m", "reduce": "min"}, tmp_path) == (1.5, None)
    assert C.measure({"file": "{work}/s.json", "path": "l.0.0"}, tmp_path) == (7, None)
    assert (
        C.measure({"file": "{work}/s.json", "path": "per.c.m"}, tmp_path)[1]
        == "{work}/s.json has no per.c.m (at 'c')"
    )
    assert (
        C.measure({"file": "{work}/none.json", "path": "a"}, tmp_path)[1]
        == "{work}/none.json was not written"
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(0, 1e3, allow_nan=False),
)
def test_a_numeric_figure_is_judged_by_its_relation_and_tolerance(expected, measured, tolerance):
    figure = {"expected": expected, "tolerance": tolerance}
    assert C.judge(figure, measured) is (abs(measured - expected) <= tolerance)
    assert C.judge({**figure, "relation": "at_most"}, measured) is (measured <= expected + tolerance)
    assert C.judge({**figure, "relation": "at_least"}, measured) is (measured >= expected - tolerance)
    assert C.judge(figure, str(measured)) is False and C.judge(figure, True) is False
    assert C.judge(figure, math.nan) is False


def test_an_unknown_claim_names_the_known_ones():
    with pytest.raises(Exception, match="no such claim") as info:
        C.find_claim(CLAIMS, "nope")
    assert "tiny-aa-tokens-identical" in info.value.render()


def test_the_claims_listing_and_a_needs_hardware_verdict_through_the_cli(tmp_path):
    from support import run_invoke

    done = run_invoke(
        "claims.reproduce", "compiled-prefix-head-latency", "--verdicts", str(tmp_path), timeout=120
    )
    assert done.returncode == 0 and "needs one NVIDIA A100-SXM4-80GB" in done.stdout
    listed = run_invoke("claims", "--verdicts", str(tmp_path), "--json", timeout=120)
    rows = {r["claim"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {c["id"] for c in CLAIMS}
    assert rows["compiled-prefix-head-latency"]["verdict"] == "needs_hardware"
    assert rows["tiny-aa-tokens-identical"]["verdict"] is None
    assert all("historical" in r["shown"] for r in rows.values() if r["origin"] == "historical")
    assert Path(tmp_path / "compiled-prefix-head-latency").is_dir()
