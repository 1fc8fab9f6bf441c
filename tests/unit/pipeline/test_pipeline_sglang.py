"""serve and bench in the container (`draftscope.pipeline.stages.serve.runner`, `draftscope.pipeline.stages.bench.runner`), run for real against the loopback fake
SGLang server (`tests/fakes/sglang_server.py`): real processes, real HTTP, real Prometheus parsing.

The fake's decoding is deterministic: request k on a server commits `accept_lengths[k % len]` tokens per verify
step after one prefill token, up to the token limit. With the limit at 16 tokens:

    tokens/step 3: 5 verify steps (15 tokens), 10 correct drafts
    tokens/step 2: 8 verify steps (the last cut to 1 token; 16 step tokens), 8 correct drafts
    tokens/step 4: 4 verify steps (4+4+4+3; 16 step tokens), 12 correct drafts

Those numbers are what the expected values below are built from.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems
from draftscope.pipeline import sglang
from draftscope.pipeline.stages.bench import runner as B
from draftscope.pipeline.stages.serve import runner as SV

from support import ROOT

FAKE = str(ROOT / "tests" / "fakes" / "sglang_server.py")
MAX_TOKENS = 16
PROMPTS = ("p0", "p1", "p2")
SCHED = 'engine_type="unified",model_name="fake-target",moe_ep_rank="0",pp_rank="0",tp_rank="0"'


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(sglang, "RETRY_DELAYS_S", (0.01, 0.02, 0.04))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fake(tmp_path: Path, name: str, *extra: str) -> dict:
    """A commands-file entry that runs the fake; its pid lands in <tmp>/<name>.pid."""
    port = free_port()
    argv = ["python", FAKE, "--port", str(port), "--pid-file", str(tmp_path / f"{name}.pid"), *extra]
    return {"name": name, "argv": argv, "env": {}, "gpus": [], "port": port}


def write_commands(tmp_path: Path, entries: list[dict], stage: str = "bench") -> Path:
    path = tmp_path / "run" / "stages" / f"{stage}.commands.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema_version": 1, "stage": stage, "commands": entries}))
    return path


def write_prompts(tmp_path: Path, ids=PROMPTS) -> Path:
    path = tmp_path / "prompts.json"
    prompts = [{"id": i, "messages": [{"role": "user", "content": f"say something about {i}"}]} for i in ids]
    path.write_text(json.dumps({"schema_version": 1, "name": "unit-prompts", "prompts": prompts}))
    return path


def bench_args(tmp_path: Path, commands: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    return p.parse_args(
        [
            "--commands",
            str(commands),
            "--prompts",
            str(write_prompts(tmp_path)),
            "--output",
            str(tmp_path / "run" / "bench" / "bench.json"),
            "--draft",
            "dflash",
            "--algorithm",
            "DFLASH",
            "--draft-tokens",
            "4",
            "--max-new-tokens",
            str(MAX_TOKENS),
            "--startup-timeout",
            "20",
            *extra,
        ]
    )


def serve_argv(tmp_path: Path, commands: Path, *extra: str) -> list[str]:
    return [
        "--commands",
        str(commands),
        "--plan",
        str(tmp_path / "run" / "serve" / "plan.json"),
        "--algorithm",
        "DFLASH",
        "--draft-path",
        "/draftscope/run/draft",
        "--startup-timeout",
        "20",
        *extra,
    ]


def serve_args(tmp_path: Path, commands: Path, *extra: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    SV.add_arguments(p)
    return p.parse_args(serve_argv(tmp_path, commands, *extra))


def pid_of(tmp_path: Path, name: str) -> int:
    return int((tmp_path / f"{name}.pid").read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def valid(obj: dict, schema: str) -> dict:
    assert problems(obj, schema) == [], problems(obj, schema)
    return obj


# --- bench ------------------------------------------------------------------------------------------------------


def test_bench_measures_the_run_mean_and_the_rate_from_the_servers_counts(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--accept-lengths", "3,2,4")])
    counts = B.main(bench_args(tmp_path, commands, "--repeats", "2"))
    result = valid(read_json(tmp_path / "run" / "bench" / "bench.json"), "stage-bench")

    # 6 requests, 16 tokens each; verify steps 5, 8, 4 per round (twice); correct drafts 10, 8, 12 of 3 per step.
    assert result["requests"] == 6
    assert result["mean_accept_length"] == pytest.approx(96 / 34)
    assert result["accept_rate"] == pytest.approx(60 / (34 * 3))
    assert result["draft_tokens_per_step"] == 3  # DFLASH block 4: the first slot is the anchor
    (inst,) = result["instances"]
    assert inst["requests"] == 6 and inst["mean_accept_length"] == pytest.approx(96 / 34)
    # /server_info: step tokens / steps, no prefill token: (15 + 16 + 16) × 2 / 34.
    assert inst["server_avg_accept_length"] == pytest.approx(94 / 34)
    assert [r["spec_verify_ct"] for r in result["per_request"]] == [5, 8, 4, 5, 8, 4]
    assert [r["prompt_id"] for r in result["per_request"]] == [*PROMPTS, *PROMPTS]
    # The ledger: steps emit correct drafts + 1 each, (30 + 17) × 2 = 94 tokens in 34 steps, the server's figure;
    # the fake's truncated last steps count more correct drafts than tokens: recorded as a disagreement.
    ledger = result["acceptance"]
    assert ledger["mean_pooled"] == pytest.approx(94 / 34) and ledger["rate"] == pytest.approx(60 / 102)
    assert ledger["per_position"] is None
    assert any(c["agrees"] is False for c in ledger["cross_checks"])
    assert counts == {
        "requests": 6,
        "instances": 1,
        "mean_accept_length": result["mean_accept_length"],
        "accept_rate": result["accept_rate"],
    }


def test_bench_splits_round_robin_and_records_each_instances_server_figures(tmp_path):
    commands = write_commands(
        tmp_path,
        [
            fake(tmp_path, "server-0", "--accept-lengths", "3,2,4"),
            fake(tmp_path, "server-1", "--accept-lengths", "2", "--model-name", "other-target"),
        ],
    )
    B.main(bench_args(tmp_path, commands, "--repeats", "2"))
    result = valid(read_json(tmp_path / "run" / "bench" / "bench.json"), "stage-bench")

    per = result["per_request"]
    assert [r["instance"] for r in per] == [0, 1, 0, 1, 0, 1]
    assert [r["prompt_id"] for r in per if r["instance"] == 0] == ["p0", "p2", "p1"]
    assert [r["prompt_id"] for r in per if r["instance"] == 1] == ["p1", "p0", "p2"]
    first, second = result["instances"]
    assert (first["index"], second["index"]) == (0, 1)
    assert first["url"].endswith(commands_port(commands, 0)) and second["url"].endswith(
        commands_port(commands, 1)
    )
    assert first["requests"] == second["requests"] == 3
    assert first["mean_accept_length"] == pytest.approx(48 / 17)  # steps 5 + 8 + 4
    assert second["mean_accept_length"] == pytest.approx(48 / 24)  # 8 steps each
    assert result["mean_accept_length"] == pytest.approx(96 / 41)
    assert first["server_avg_accept_length"] == pytest.approx(47 / 17)
    assert second["server_avg_accept_length"] == pytest.approx(2.0)

    # /metrics: sglang:* samples only, keyed with sorted labels; the gauges are the last window (the last request).
    m0, m1 = first["metrics"], second["metrics"]
    assert m0[f"sglang:spec_accept_length{{{SCHED}}}"] == pytest.approx(4.0)  # the last request on 0: 4/step
    assert m0[f"sglang:spec_accept_rate{{{SCHED}}}"] == pytest.approx(12 / 12)
    assert m0['sglang:spec_verify_calls_total{engine_type="unified",model_name="fake-target"}'] == 17.0
    assert m1['sglang:spec_verify_calls_total{engine_type="unified",model_name="other-target"}'] == 24.0
    assert all(k.startswith("sglang:") for k in (*m0, *m1)) and len(m0) == 6


def commands_port(commands: Path, index: int) -> str:
    return f":{json.loads(commands.read_text())['commands'][index]['port']}"


def test_dspark_drafts_gamma_tokens_per_step(tmp_path):
    # DSPARK gamma 3: SGLang's verify window is gamma + 1 = 4 (the fake's --draft-tokens), 3 drafted per step.
    commands = write_commands(
        tmp_path, [fake(tmp_path, "server-0", "--accept-lengths", "4", "--algorithm", "DSPARK")]
    )
    args = bench_args(tmp_path, commands, "--draft", "dspark", "--algorithm", "DSPARK", "--draft-tokens", "3")
    B.main(args)
    result = valid(read_json(tmp_path / "run" / "bench" / "bench.json"), "stage-bench")
    assert result["draft_tokens_per_step"] == 3
    assert result["accept_rate"] == pytest.approx(36 / 36)  # 4 tokens per step: every draft accepted


def test_the_rate_formula_when_the_server_gives_no_draft_counts():
    rows = [{"completion_tokens": 16, "spec_verify_ct": 8, "spec_accept_length": 2.0}]
    mean = B._mean_accept_length(rows)
    assert mean == 2.0
    assert B._accept_rate(rows, mean, B._drafted_per_step("DFLASH", 5, [])) == pytest.approx(1 / 4)
    assert B._accept_rate(rows, mean, B._drafted_per_step("DSPARK", 5, [])) == pytest.approx(1 / 5)
    # No verify count anywhere: the plain mean of the per-request figures.
    assert B._mean_accept_length([{"spec_accept_length": 2.0}, {"spec_accept_length": 3.0}]) == 2.5
    assert B._mean_accept_length([{"completion_tokens": 1, "spec_accept_length": None}]) is None


def test_bench_writes_every_request_as_it_arrives(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0")])
    B.main(bench_args(tmp_path, commands, "--concurrency", "2"))
    lines = (tmp_path / "run" / "bench" / "requests.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted(r["seq"] for r in rows) == [0, 1, 2]
    assert {r["prompt_id"] for r in rows} == set(PROMPTS)
    assert all(r["spec_num_proposed_drafts"] == 3 * r["spec_verify_ct"] for r in rows)


def test_transient_503s_are_retried(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--fail-first", "3")])
    B.main(bench_args(tmp_path, commands))
    result = valid(read_json(tmp_path / "run" / "bench" / "bench.json"), "stage-bench")
    assert result["requests"] == 3
    log = (tmp_path / "run" / "logs" / "bench.server-0.log").read_text()
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 503') == 3
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == 3


def test_a_request_that_keeps_failing_fails_the_stage_naming_prompt_and_instance(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--fail-first", "4")])
    with pytest.raises(UserError) as err:
        B.main(bench_args(tmp_path, commands))
    message = err.value.render()
    assert "prompt 'p0'" in message and "instance 0 (server-0" in message and "HTTP 503" in message
    assert "after 4 attempt(s)" in message and "\n" not in message
    assert not (tmp_path / "run" / "bench" / "bench.json").exists()
    assert gone(pid_of(tmp_path, "server-0"))


def test_a_server_that_dies_mid_run_fails_the_stage_and_leaves_no_process(tmp_path):
    commands = write_commands(
        tmp_path, [fake(tmp_path, "server-0"), fake(tmp_path, "server-1", "--die-after", "1")]
    )
    with pytest.raises(UserError) as err:
        B.main(bench_args(tmp_path, commands, "--repeats", "2"))
    message = err.value.render()
    # server-1 answers seq 1 (p1) and dies on seq 3 (p0, repeat 1).
    assert "prompt 'p0' (repeat 1)" in message and "instance 1 (server-1" in message
    assert "exited with code 17" in message
    assert gone(pid_of(tmp_path, "server-0")) and gone(pid_of(tmp_path, "server-1"))
    rows = [json.loads(x) for x in (tmp_path / "run" / "bench" / "requests.jsonl").read_text().splitlines()]
    assert 1 in {r["seq"] for r in rows}  # what was measured before the failure is kept


def test_a_server_that_never_becomes_healthy_fails_and_is_stopped(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--never-healthy")])
    args = bench_args(tmp_path, commands, "--startup-timeout", "1.5")
    with pytest.raises(UserError, match="server-0 not healthy after"):
        B.main(args)
    assert gone(pid_of(tmp_path, "server-0"))


def test_a_server_that_exits_early_fails_and_its_healthy_sibling_is_stopped(tmp_path):
    broken = {
        "name": "server-1",
        "argv": ["python", "-c", "import sys, time; time.sleep(1); sys.exit(3)"],
        "env": {},
        "gpus": [],
        "port": free_port(),
    }
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--startup-delay", "0.5"), broken])
    with pytest.raises(UserError, match="server-1 exited with code 3 before it was healthy"):
        B.main(bench_args(tmp_path, commands))
    assert gone(pid_of(tmp_path, "server-0"))


def test_bench_refuses_bad_arguments_before_starting_anything(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0")])
    with pytest.raises(UserError, match="--draft-tokens"):
        B.main(bench_args(tmp_path, commands, "--draft-tokens", "1"))
    with pytest.raises(UserError, match="--repeats"):
        B.main(bench_args(tmp_path, commands, "--repeats", "0"))
    assert not (tmp_path / "server-0.pid").exists()


def test_bench_through_the_in_container_entry_point(tmp_path, capsys):
    from draftscope.pipeline.__main__ import main as pipeline_main

    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--accept-lengths", "2")])
    args = bench_args(tmp_path, commands)
    result = tmp_path / "run" / "stages" / "bench.result.json"
    argv = [
        "bench",
        "--result",
        str(result),
        "--commands",
        str(commands),
        "--prompts",
        args.prompts,
        "--output",
        args.output,
        "--draft",
        "dflash2",
        "--algorithm",
        "DFLASH",
        "--draft-tokens",
        "4",
        "--max-new-tokens",
        str(MAX_TOKENS),
        "--startup-timeout",
        "20",
    ]
    assert pipeline_main(argv) == 0
    counts = read_json(result)["counts"]
    assert counts["requests"] == 3 and counts["mean_accept_length"] == pytest.approx(2.0)
    assert counts["accept_rate"] == pytest.approx(1 / 3)
    assert valid(read_json(Path(args.output)), "stage-bench")["draft"] == "dflash2"
    # A failure is one line on stderr and exit code 2.
    commands = write_commands(tmp_path, [fake(tmp_path, "server-1", "--fail-first", "9")])
    argv[argv.index("--commands") + 1] = str(commands)
    capsys.readouterr()
    assert pipeline_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "prompt 'p0'" in err and "\n" not in err


# --- serve ------------------------------------------------------------------------------------------------------


def test_serve_writes_a_valid_plan_and_stops_the_instances(tmp_path):
    entries = [fake(tmp_path, "server-0", "--startup-delay", "0.3"), fake(tmp_path, "server-1")]
    entries[1]["env"] = {"EXTRA": "1"}
    commands = write_commands(tmp_path, entries, stage="serve")
    counts = SV.main(serve_args(tmp_path, commands))
    plan = valid(read_json(tmp_path / "run" / "serve" / "plan.json"), "stage-serve")
    assert counts == {"instances": 2, "healthy": 2, "speculating": 2}
    assert plan["algorithm"] == "DFLASH" and plan["draft_path"] == "/draftscope/run/draft"
    for index, (inst, entry) in enumerate(zip(plan["instances"], entries, strict=True)):
        assert inst["index"] == index and inst["port"] == entry["port"] and inst["healthy"] is True
        assert inst["gpus"] == [] and inst["tp"] == 1
        assert inst["url"] == f"http://127.0.0.1:{entry['port']}"
        assert inst["command"] == entry
    # Each got one smoke request, and is stopped now.
    for name in ("server-0", "server-1"):
        assert (tmp_path / "run" / "logs" / f"serve.{name}.log").read_text().count(
            "/v1/chat/completions"
        ) == 1
        assert gone(pid_of(tmp_path, name))


def test_serve_fails_when_the_server_does_not_speculate(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--no-speculation")], stage="serve")
    with pytest.raises(UserError, match="not speculating"):
        SV.main(serve_args(tmp_path, commands))
    assert not (tmp_path / "run" / "serve" / "plan.json").exists()
    assert gone(pid_of(tmp_path, "server-0"))


HOLD_SCRIPT = """
import argparse, sys
from draftscope.pipeline.stages.serve import runner as SV
p = argparse.ArgumentParser()
SV.add_arguments(p)
print(SV.main(p.parse_args(sys.argv[1:])), flush=True)
"""


def test_serve_hold_keeps_serving_until_sigterm(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0")], stage="serve")
    plan = tmp_path / "run" / "serve" / "plan.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRIPT, *serve_argv(tmp_path, commands, "--hold")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not plan.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert plan.exists(), proc.stdout.read() if proc.poll() is not None else "no plan in 30 s"
        time.sleep(0.5)
        assert proc.poll() is None  # still holding
        url = read_json(plan)["instances"][0]["url"]
        from draftscope.pipeline.servers import healthy

        assert healthy(url)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "'instances': 1" in out
    assert gone(pid_of(tmp_path, "server-0"))


@pytest.fixture(autouse=True)
def no_stray_fakes(tmp_path):
    """Whatever a test does, no fake it started outlives it."""
    yield
    for pid_file in tmp_path.glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            pid = int(pid_file.read_text())
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"a fake server (pid {pid}) outlived its test")


# --- STANDALONE (a draft model) and the generated token ids -------------------------------------------------------


def test_standalone_drafts_the_window_less_the_targets_token_and_rows_keep_the_token_ids(tmp_path):
    commands = write_commands(tmp_path, [fake(tmp_path, "server-0", "--accept-lengths", "3,2,4")])
    args = bench_args(tmp_path, commands)
    args.algorithm, args.draft = "STANDALONE", "model"
    B.main(args)
    result = valid(read_json(tmp_path / "run" / "bench" / "bench.json"), "stage-bench")
    assert result["algorithm"] == "STANDALONE" and result["draft"] == "model"
    # --speculative-num-draft-tokens 4 = 3 drafted + the target's own token, as DFLASH's block.
    assert result["draft_tokens_per_step"] == 3
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "bench" / "requests.jsonl").read_text().splitlines()
    ]
    assert [r["token_ids"] for r in rows] == [list(range(MAX_TOKENS))] * len(PROMPTS)


@pytest.mark.parametrize(
    "ids",
    [[1, -2], [1, "2"], "12", {"0": 1}, [1.0], [True]],
    ids=["negative", "text", "string", "map", "float", "bool"],
)
def test_token_ids_that_are_not_token_ids_are_refused(ids):
    reply = {"choices": [{"response_token_ids": ids}]}
    with pytest.raises(UserError, match="response_token_ids is not a list of token ids"):
        sglang.response_token_ids(reply, what="reply")
    assert sglang.response_token_ids({"choices": [{}]}, what="reply") is None
    assert sglang.response_token_ids({"choices": [{"response_token_ids": [0, 7]}]}, what="r") == [0, 7]
