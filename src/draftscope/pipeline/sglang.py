"""What the `serve` and `bench` stages share in the container: SGLang's endpoint, its instances, checked output.

Both start the instances of the stage's commands file (`servers.serving`: own GPUs, logs in `logs/`, `/health`,
always stopped), talk to them over loopback HTTP and write a schema-checked JSON file. The runners themselves are
`stages/serve/runner.py` and `stages/bench/runner.py`.

Endpoint. Requests go to SGLang's OpenAI-compatible `POST /v1/chat/completions` with `"return_meta_info": true`:
the server applies the target's chat template (no tokenizer in the client) and returns the scheduler's per-request
`meta_info` at `choices[0].meta_info`. Read in the pinned SGLang 0.5.23 wheel: `ChatCompletionRequest.
return_meta_info` and `ChatCompletionResponseChoice.meta_info` (`sglang/srt/entrypoints/openai/protocol.py`),
`choice_meta_info = ret_item["meta_info"] if request.return_meta_info` (`…/openai/serving_chat.py`), and the
fields of that dict, written by `TokenizerManager._calculate_spec_decoding_metrics`
(`sglang/srt/managers/tokenizer_manager.py`) when the request had at least one verify step:
`spec_verify_ct`, `spec_accept_length = completion_tokens / spec_verify_ct`, `spec_num_correct_drafts`,
`spec_num_proposed_drafts = spec_verify_ct × (speculative_num_draft_tokens − 1)`, `spec_accept_rate`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftscope.core import datasets
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.schema import check, problems
from draftscope.pipeline import servers
from draftscope.pipeline.base import Command

SCHEMA_VERSION = 1
# STANDALONE: a draft model (serve.draft=model), what SGLang's CPU engine serves.
ALGORITHMS = ("DFLASH", "DSPARK", "STANDALONE")
DRAFTS = ("dflash", "dflash2", "dspark", "model")
CHAT_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"
REQUEST_TIMEOUT_S = 600.0  # one greedy completion of max_new_tokens on a large target under load
RETRY_DELAYS_S = (1.0, 2.0, 4.0)  # three retries, backing off
DEFAULT_STARTUP_TIMEOUT_S = 1800.0


# --- arguments ----------------------------------------------------------------------------------------------------


def common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--commands", required=True, help="the stage's commands file (stages/<stage>.commands.json)"
    )
    p.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default=None,
        help="SGLang's --speculative-algorithm (default: read from the server argv)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=DEFAULT_STARTUP_TIMEOUT_S,
        help="seconds each instance has to answer /health",
    )
    p.add_argument("--logs", default=None, help="server logs (default: <dir of --commands>/../logs)")


# --- HTTP to SGLang -----------------------------------------------------------------------------------------------


def chat_body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """A greedy, non-streaming chat completion asking for SGLang's meta_info (return_meta_info needs stream off) and
    the generated token ids."""
    return {
        "model": "default",  # SGLang's DEFAULT_MODEL_NAME: the served model, whatever its path
        "messages": messages,
        "temperature": 0.0,
        "max_completion_tokens": max_tokens,
        "stream": False,
        "return_meta_info": True,
        # choices[0].response_token_ids: the generated ids, compared with the target's greedy output (0.5.18 and
        # 0.5.23: ChatCompletionRequest.return_token_ids, serving_chat.py).
        "return_token_ids": True,
    }


def response_token_ids(reply: dict[str, Any], *, what: str) -> list[int] | None:
    """`choices[0].response_token_ids` when the server sent them (a list of token ids), else None; anything else
    there is refused: it is the server's data, and a wrong type would pass for tokens."""
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    ids = first.get("response_token_ids")
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        raise UserError(f"{what}: choices[0].response_token_ids is not a list of token ids: {str(ids)[:80]}")
    return ids


def post_with_retries(group: servers.ServerGroup, index: int, body: dict[str, Any], *, what: str) -> dict:
    """POST a chat completion; retry what `servers.retryable` allows (408/409/425/429, 5xx, no answer) three times with backoff; a one-line
    UserError naming `what` and the instance when it still fails."""
    run = group.running[index]
    url = run.url + CHAT_PATH
    reason = ""
    for attempt in range(len(RETRY_DELAYS_S) + 1):
        if attempt:
            time.sleep(RETRY_DELAYS_S[attempt - 1])
        try:
            status, raw = servers.request("POST", url, body, timeout=REQUEST_TIMEOUT_S)
        except (servers.HttpError, http.client.HTTPException) as exc:
            status, reason = None, str(exc) or type(exc).__name__
        else:
            if status == 200:
                try:
                    reply = json.loads(raw)
                except ValueError:
                    reason = "HTTP 200 with a body that is not JSON"
                    break
                if isinstance(reply, dict):
                    return reply
                reason = "HTTP 200 with a JSON body that is not an object"
                break
            reason = f"HTTP {status}: {raw.decode('utf-8', 'replace')[:200]}"
        if not servers.retryable(status):
            break
    code = run.process.poll()
    died = f"; {run.command.name} exited with code {code}" if code is not None else ""
    attempts = f" after {attempt + 1} attempt(s)" if attempt else ""
    raise UserError(
        f"{what} failed on instance {index} ({run.command.name}, {run.url}){attempts}: {reason}{died}",
        field=f"{group.stage}.instances[{index}]",
        fix=f"read {run.log}",
    )


def meta_info(reply: dict[str, Any], *, what: str) -> dict[str, Any]:
    choices = reply.get("choices")
    meta = (
        choices[0].get("meta_info")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict)
        else None
    )
    if not isinstance(meta, dict):
        raise UserError(
            f"{what} has no choices[0].meta_info",
            fix="serve with SGLang 0.5.23 or later (return_meta_info in the OpenAI chat endpoint)",
        )
    return meta


# --- the commands file and the output -----------------------------------------------------------------------------


def server_commands(path: str) -> list[Command]:
    commands = servers.servers_of(servers.load_commands(path))
    if not commands:
        raise UserError("the commands file lists no server (no command with a port)", source=str(path))
    return commands


def speculative_algorithm(given: str | None, commands: Sequence[Command]) -> str:
    found = given or argv_value(commands[0].argv, "--speculative-algorithm")
    if found not in ALGORITHMS:
        raise UserError(
            "no speculative algorithm",
            field="--algorithm",
            value=found,
            fix=f"pass --algorithm {'|'.join(ALGORITHMS)}",
        )
    return found


def argv_value(argv: Sequence[str], flag: str) -> str | None:
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None


def logs_dir(args: argparse.Namespace) -> Path:
    if args.logs:
        return Path(args.logs)
    return Path(args.commands).resolve().parent.parent / "logs"


def write_checked(path: Path, obj: dict[str, Any], schema: str) -> None:
    """Validate, then write atomically: an invalid file is never written."""
    found = problems(obj, schema)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(
            f"the result does not validate against {schema}: {found[0].render(str(path))}{more}",
            source=str(path),
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, obj)


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


# --- what the servers answer and the prompts they are sent ----------------------------------------------------


def sglang_samples(text: str) -> dict[str, float]:
    """Every finite `sglang:*` sample of a Prometheus text exposition as {"name{k="v",…}": value}, labels sorted."""
    # lazy: prometheus_client, in the image only, for SGLang's metrics
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("sglang:") or not math.isfinite(sample.value):
                continue
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def load_prompts(path: str) -> list[dict[str, Any]]:
    """A prompts file's entries, checked against its schema and for unique ids."""
    data = read_json(Path(path), expect=dict)
    check(data, "prompts", path)
    ids = [p["id"] for p in data["prompts"]]
    datasets.check_unique_ids(ids, path)
    return data["prompts"]
