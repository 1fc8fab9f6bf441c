"""Contract: every field, route and metric the serve/bench client reads — and the fake server writes — exists in the
pinned SGLang 0.5.23 wheel, with the meaning the client gives it.

- The endpoint: `POST /v1/chat/completions` takes `return_meta_info` (and every other key the client sends) and
  hands the scheduler's `meta_info` back at `choices[0].meta_info` (`openai/protocol.py`, `openai/serving_chat.py`).
- `meta_info`'s speculative fields and their formulas (`managers/tokenizer_manager.py`); the acceptance-rate
  definition (`scheduler_components/metrics_reporter.py`) and the verify windows of DFLASH (B) and DSPARK (γ + 1)
  (`arg_groups/speculative_hook.py`).
- `/health`, `/server_info` → `internal_states[…].avg_spec_accept_length` (`entrypoints/http_server.py`,
  `scheduler_components/internal_state.py`), `/metrics` and the `sglang:*` gauge and counter names and labels
  (`observability/metrics_collector.py`).
- The fake (`tests/fakes/sglang_server.py`), run here, answers only with keys, metric names and labels found above.

The wheel is read with `ast` and as text, never imported.
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from releases import SGLANG_PLATFORM, SGLANG_VERSION, Release, pinned_release

from draftscope.pipeline import sglang as S
from draftscope.pipeline.stages.bench import runner as B

pytestmark = pytest.mark.contract

VERSION = SGLANG_VERSION
FAKE = Path(__file__).resolve().parents[1] / "fakes" / "sglang_server.py"

# What the serve and bench runners read from a chat reply's choices[0].meta_info and from /server_info.
CLIENT_META_FIELDS = (
    "completion_tokens",
    "spec_verify_ct",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_accept_rate",
    "finish_reason",
)
SPEC_FIELDS = CLIENT_META_FIELDS[1:6]
GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")


@pytest.fixture(scope="module")
def sglang() -> Release:
    return pinned_release("sglang", VERSION, platform=SGLANG_PLATFORM)


# --- reading the wheel ----------------------------------------------------------------------------------------------


def class_fields(release: Release, module: str, name: str) -> dict[str, ast.AnnAssign]:
    for node in ast.walk(release.tree(module)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id: s
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise AssertionError(f"{module} has no class {name}")


def function(release: Release, module: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(release.tree(module)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{module} has no function {name}")


def keys_written(node: ast.AST, var: str) -> dict[str, ast.expr | None]:
    """Keys of `var` written under `node`: `var = {…}`, `var["k"] = …`, `var.update({…})`, `var.update(k=…)`."""
    found: dict[str, ast.expr | None] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Assign):
            for target in n.targets:
                if isinstance(target, ast.Name) and target.id == var and isinstance(n.value, ast.Dict):
                    found.update(dict_items(n.value))
                if (
                    isinstance(target, ast.Subscript)
                    and getattr(target.value, "id", None) == var
                    and isinstance(target.slice, ast.Constant)
                ):
                    found[target.slice.value] = n.value
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "update"
            and getattr(n.func.value, "id", None) == var
        ):
            for arg in n.args:
                if isinstance(arg, ast.Dict):
                    found.update(dict_items(arg))
            found.update({k.arg: k.value for k in n.keywords if k.arg})
    return found


def dict_items(node: ast.Dict) -> dict[str, ast.expr]:
    return {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}


def routes(release: Release, module: str) -> dict[tuple[str, str], str]:
    """(method, path) → handler name, from `@app.get("/path")`-style decorators."""
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(release.tree(module)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                if (
                    isinstance(d, ast.Call)
                    and isinstance(d.func, ast.Attribute)
                    and getattr(d.func.value, "id", "") == "app"
                    and d.args
                    and isinstance(d.args[0], ast.Constant)
                ):
                    out[(d.func.attr.upper(), d.args[0].value)] = node.name
    return out


def metric_definitions(release: Release) -> dict[str, tuple[str, set[str]]]:
    """Metric name → (Gauge/Counter/Histogram/Summary, the label names it may carry)."""
    module = "sglang.srt.observability.metrics_collector"
    scheduler = scheduler_labels(release)
    tokenizer = set(keys_written(function(release, module, "tokenizer_metric_labels"), "labels"))
    out: dict[str, tuple[str, set[str]]] = {}
    for node in ast.walk(release.tree(module)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if node.func.id not in ("Gauge", "Counter", "Histogram", "Summary") or "name" not in kw:
            continue
        if not (isinstance(kw["name"], ast.Constant) and isinstance(kw["name"].value, str)):
            continue
        extra = {
            c.value for c in ast.walk(kw.get("labelnames", ast.List(elts=[]))) if isinstance(c, ast.Constant)
        }
        out[kw["name"].value] = (node.func.id, scheduler | tokenizer | extra)
    return out


def scheduler_labels(release: Release) -> set[str]:
    """The label keys SchedulerMetricsCollector's scheduler side is built with."""
    tree = release.tree("sglang.srt.observability.metrics_collector")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "labels" for t in node.targets)
            and isinstance(node.value, ast.Dict)
            and "tp_rank" in dict_items(node.value)
        ):
            return set(dict_items(node.value))
    raise AssertionError("no scheduler metric labels found")


def meta_info_keys(release: Release) -> dict[str, ast.expr | None]:
    tm = release.tree("sglang.srt.managers.tokenizer_manager")
    return keys_written(tm, "meta_info")


# --- the endpoint -------------------------------------------------------------------------------------------------


def test_the_chat_endpoint_takes_every_key_the_client_sends(sglang):
    assert ("POST", "/v1/chat/completions") in routes(sglang, "sglang.srt.entrypoints.http_server")
    fields = class_fields(sglang, "sglang.srt.entrypoints.openai.protocol", "ChatCompletionRequest")
    body = S.chat_body([{"role": "user", "content": "hi"}], 8)
    assert set(body) <= set(fields), set(body) - set(fields)
    assert ast.unparse(fields["return_meta_info"].value) == "False"  # off unless asked
    protocol = sglang.source("sglang.srt.entrypoints.openai.protocol")
    assert f'DEFAULT_MODEL_NAME = "{body["model"]}"' in protocol


def test_meta_info_comes_back_at_choices_0(sglang):
    choice = class_fields(sglang, "sglang.srt.entrypoints.openai.protocol", "ChatCompletionResponseChoice")
    assert "meta_info" in choice
    chat = sglang.source("sglang.srt.entrypoints.openai.serving_chat")
    assert 'ret_item["meta_info"] if request.return_meta_info else None' in chat
    assert "meta_info=choice_meta_info" in chat
    # return_meta_info is refused with streaming: the client never streams.
    assert "Please set stream=false when using return_meta_info=true." in chat
    assert S.chat_body([], 1)["stream"] is False


def test_the_client_reads_only_fields_sglang_writes_into_meta_info(sglang):
    written = meta_info_keys(sglang)
    missing = [f for f in CLIENT_META_FIELDS if f not in written]
    assert not missing, missing
    spec = keys_written(
        function(sglang, "sglang.srt.managers.tokenizer_manager", "_calculate_spec_decoding_metrics"),
        "meta_info",
    )
    assert set(SPEC_FIELDS) <= set(spec)
    # The formulas the module docstring relies on.
    assert (
        ast.unparse(spec["spec_accept_length"])
        == "recv_obj.completion_tokens[i] / recv_obj.spec_verify_ct[i]"
    )
    assert ast.unparse(spec["spec_accept_rate"]) == "num_correct_drafts / num_proposed_drafts"
    body = ast.unparse(
        function(sglang, "sglang.srt.managers.tokenizer_manager", "_calculate_spec_decoding_metrics")
    )
    assert (
        "num_proposed_drafts = recv_obj.spec_verify_ct[i] * (get_spec().speculative_num_draft_tokens - 1)"
        in body
    )
    # completion_tokens sits beside them in the same dict.
    assert ast.unparse(written["completion_tokens"]) == "recv_obj.completion_tokens[i]"


def test_the_acceptance_rate_definition_and_the_verify_windows(sglang):
    reporter = sglang.source("sglang.srt.managers.scheduler_components.metrics_reporter")
    assert "draft_per_round = get_spec().speculative_num_draft_tokens - 1" in reporter
    assert "num_correct_drafts / total_draft_tokens" in reporter
    assert "total_draft_tokens = self.spec_num_forward_ct * draft_per_round" in reporter
    hook = sglang.source("sglang.srt.arg_groups.speculative_hook")
    # DFLASH: the window is the block (bench's --draft-tokens B → B − 1 drafted per step).
    assert "speculative_num_draft_tokens=int(cfg.speculative_dflash_block_size)" in hook
    # DSPARK: --speculative-dspark-block-size γ → window γ + 1 (bench's --draft-tokens γ → γ drafted per step).
    assert "verify_window = int(gamma) + 1" in hook and "speculative_num_draft_tokens=verify_window" in hook
    assert B._drafted_per_step("DFLASH", 16, []) == 15 and B._drafted_per_step("DSPARK", 7, []) == 7
    # One verify step commits its correct drafts plus the bonus token: accept length − 1 = correct drafts per step.
    processor = sglang.source("sglang.srt.managers.scheduler_components.batch_result_processor")
    assert "# Commit the full accepted run (drafts + bonus)." in processor
    assert "req.spec_verify_ct += 1" in processor


# --- health, server_info, metrics -----------------------------------------------------------------------------------


def test_health_and_server_info_routes(sglang):
    found = routes(sglang, "sglang.srt.entrypoints.http_server")
    assert ("GET", S.HEALTH_PATH) in found and ("GET", "/server_info") in found
    handler = function(sglang, "sglang.srt.entrypoints.http_server", found[("GET", "/server_info")])
    assert any(isinstance(n, ast.Dict) and "internal_states" in dict_items(n) for n in ast.walk(handler))


def test_avg_spec_accept_length_is_cumulative_accepted_tokens_per_verify_step(sglang):
    module = "sglang.srt.managers.scheduler_components.internal_state"
    assert "avg_spec_accept_length" in keys_written(function(sglang, module, "_add_speculative"), "state")
    average = ast.unparse(function(sglang, module, "_average_accept_length"))
    assert (
        "metrics_reporter.spec_total_num_accept_tokens / metrics_reporter.spec_total_num_forward_ct"
        in average
    )


def test_metrics_route_and_gauges(sglang):
    assert 'Mount("/metrics", make_asgi_app(registry=registry))' in sglang.source("sglang.srt.utils.common")
    metrics = metric_definitions(sglang)
    for gauge in GAUGES:
        assert metrics[gauge][0] == "Gauge", gauge
    assert scheduler_labels(sglang) >= {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
    collector = sglang.source("sglang.srt.observability.metrics_collector")
    # Last-window gauges, not counters: recorded, never averaged.
    assert collector.count('multiprocess_mode="mostrecent"') > 2
    assert "self._log_gauge(self.spec_accept_length, stats.spec_accept_length)" in collector


# --- the fake speaks the pinned release -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_replies(tmp_path_factory):
    """Start the fake, send one client request, read /server_info and /metrics; stop it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path_factory.mktemp("fake") / "fake.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE), "--port", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        body = json.dumps(S.chat_body([{"role": "user", "content": "hi"}], 16)).encode()
        req = urllib.request.Request(
            base + S.CHAT_PATH, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            chat = json.loads(resp.read())
        with urllib.request.urlopen(base + "/server_info", timeout=10) as resp:
            info = json.loads(resp.read())
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return chat, info, metrics


def test_the_fakes_chat_reply_uses_sglangs_keys(sglang, fake_replies):
    chat, _, _ = fake_replies
    protocol = "sglang.srt.entrypoints.openai.protocol"
    assert set(chat) <= set(class_fields(sglang, protocol, "ChatCompletionResponse")) | {
        "id",
        "object",
        "created",
    }
    (choice,) = chat["choices"]
    assert set(choice) <= set(class_fields(sglang, protocol, "ChatCompletionResponseChoice"))
    assert set(choice["message"]) <= set(class_fields(sglang, protocol, "ChatMessage"))
    assert set(chat["usage"]) <= set(class_fields(sglang, protocol, "UsageInfo"))
    extra = set(choice["meta_info"]) - set(meta_info_keys(sglang))
    assert not extra, extra
    assert set(CLIENT_META_FIELDS) <= set(choice["meta_info"])
    assert choice["meta_info"]["finish_reason"]["type"] == "length"  # FINISH_LENGTH.to_json
    assert '"type": "length"' in sglang.source("sglang.srt.managers.schedule_batch")


def test_the_fakes_server_info_uses_sglangs_keys(sglang, fake_replies):
    _, info, _ = fake_replies
    handler = function(sglang, "sglang.srt.entrypoints.http_server", "server_info")
    top = {k for n in ast.walk(handler) if isinstance(n, ast.Dict) for k in dict_items(n)}
    fields = set()
    for name in sglang._names:
        if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
            module = name[:-3].replace("/", ".")
            fields |= {
                n.target.id
                for n in ast.walk(sglang.tree(module))
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
    assert set(info) <= top | fields, set(info) - top - fields
    state_module = "sglang.srt.managers.scheduler_components.internal_state"
    written = set(keys_written(sglang.tree(state_module), "state"))
    assert set(info["internal_states"][0]) <= written, set(info["internal_states"][0]) - written


def test_the_fakes_metrics_are_sglangs(sglang, fake_replies):
    from prometheus_client.parser import text_string_to_metric_families

    _, _, text = fake_replies
    defined = metric_definitions(sglang)
    kinds = {"Gauge": "gauge", "Counter": "counter"}
    seen = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("sglang:"):
                continue
            assert sample.name in defined, sample.name
            kind, labels = defined[sample.name]
            assert family.type == kinds[kind], (sample.name, family.type)
            assert set(sample.labels) <= labels, (sample.name, set(sample.labels) - labels)
            seen.add(sample.name)
    assert set(GAUGES) <= seen
