"""A test double of an SGLang 0.5.23 server: the endpoints and reply shapes the kit's serve and bench stages read.

It is not SGLang and decodes nothing. It answers, on loopback, with the same field names and formats the pinned
release writes (checked against the wheel's source by `tests/contract/test_sglang_responses.py`):

- `GET /health`: 200 with an empty body once "started"; 503 while starting (`--startup-delay`) or for ever
  (`--never-healthy`), as `sglang/srt/entrypoints/http_server.py` does while `ServerStatus.Starting`.
- `POST /v1/chat/completions` with `"return_meta_info": true`: an OpenAI chat completion whose `choices[0].meta_info`
  carries what `TokenizerManager` puts there (`sglang/srt/managers/tokenizer_manager.py`): `completion_tokens`,
  and, because a speculative algorithm is on, `spec_verify_ct`, `spec_accept_length = completion_tokens /
  spec_verify_ct`, `spec_num_correct_drafts`, `spec_num_proposed_drafts = spec_verify_ct × (draft_tokens − 1)` and
  `spec_accept_rate = correct / proposed`.
- `GET /server_info`: `internal_states[0].avg_spec_accept_length` = accepted tokens / verify steps, cumulative
  (`scheduler_components/internal_state.py`). The real server folds a step into it only when a decode log
  window closes; this double counts every step at once.
- `GET /metrics`: Prometheus text exposition as prometheus_client's multiprocess registry writes it: the scheduler's
  `sglang:spec_accept_length` / `sglang:spec_accept_rate` gauges (here: the last request only — the real ones
  cover the last logging window) with labels `model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`, the
  tokenizer's `sglang:*_total` counters, and one non-SGLang metric the client must ignore.

Decoding is simulated, deterministically: request k (counted per server, successful answers only) takes
`accept_lengths[k % len]` tokens per verify step (accepted drafts + the bonus token). As in SGLang, the first
output token comes from the prefill; then verify steps commit that many tokens each until `max_completion_tokens`
is reached (the last step is cut to the limit).

    python tests/fakes/sglang_server.py --port P [--accept-lengths 3,2,4] [--draft-tokens 4]
        [--fail-first N] [--die-after N] [--startup-delay S] [--never-healthy] [--pid-file F]
        [--no-speculation]

`--fail-first N` answers the first N chat requests with 503; `--die-after N` exits (without answering) when the
chat request after the N-th successful one arrives; `--no-speculation` answers as a server started without a
speculative algorithm (no `spec_*` fields in meta_info, no `avg_spec_accept_length`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_MAX_TOKENS = 16


class State:
    """What the fake server has answered so far (guarded by a lock: the server is threaded)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.accept_lengths = [int(x) for x in args.accept_lengths.split(",") if x.strip()]
        if not self.accept_lengths or min(self.accept_lengths) < 1:
            raise SystemExit("--accept-lengths: positive integers, comma-separated")
        if max(self.accept_lengths) > args.draft_tokens:
            raise SystemExit("--accept-lengths: a step cannot commit more than --draft-tokens tokens")
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.chat_calls = 0  # every chat request, failed ones included
        self.answered = 0  # successful chat answers
        self.step_tokens = 0  # accepted drafts + bonus, summed over verify steps
        self.steps = 0
        self.generated = 0
        self.prompt_tokens = 0
        self.last_accept_length = 0.0
        self.last_accept_rate = 0.0

    def simulate(self, per_step: int, max_tokens: int) -> dict:
        """One request's decode: (completion tokens, verify steps, accepted tokens over steps)."""
        completion, steps, step_tokens = 1, 0, 0
        while completion < max_tokens:
            take = min(per_step, max_tokens - completion)
            completion += take
            step_tokens += per_step
            steps += 1
        return {"completion": min(completion, max_tokens), "steps": steps, "step_tokens": step_tokens}


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-sglang/0.5.23"
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> State:
        return self.server.state  # type: ignore[attr-defined]

    # --- plumbing --------------------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: object) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"))

    def _error(self, status: int, message: str) -> None:
        # SGLang's OpenAI error body (`ErrorResponse`): object, message, type, param, code.
        self._json(
            status,
            {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": status},
        )

    # --- endpoints -------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            starting = time.monotonic() - self.state.started < self.state.args.startup_delay
            self._send(503 if (self.state.args.never_healthy or starting) else 200, b"", "text/plain")
        elif path == "/server_info":
            self._json(200, self.server_info())
        elif path == "/metrics":
            self._send(200, self.metrics().encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            self._json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._error(400, "invalid JSON")
            return
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._error(400, "messages: field required")
            return
        args, state = self.state.args, self.state
        with state.lock:
            state.chat_calls += 1
            if state.chat_calls <= args.fail_first:
                fail = True
            else:
                fail = False
                if args.die_after is not None and state.answered >= args.die_after:
                    sys.stderr.write("fake-sglang: dying as asked (--die-after)\n")
                    sys.stderr.flush()
                    os._exit(17)
                reply = self.complete(body)
        if fail:
            self._error(503, "The server is overloaded (fake, --fail-first)")
            return
        self._json(200, reply)

    # --- replies ---------------------------------------------------------------------------------------------

    def complete(self, body: dict) -> dict:
        """The chat completion for the next request (called under the lock)."""
        state, args = self.state, self.state.args
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS)
        per_step = state.accept_lengths[state.answered % len(state.accept_lengths)]
        sim = state.simulate(per_step, max_tokens)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 4
        rid = f"fake-{os.getpid()}-{state.answered}"
        state.answered += 1
        state.steps += sim["steps"]
        state.step_tokens += sim["step_tokens"]
        state.generated += sim["completion"]
        state.prompt_tokens += prompt_tokens
        meta: dict = {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_tokens},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": sim["completion"],
            "cached_tokens": 0,
            "e2e_latency": 0.001,
        }
        if sim["steps"] > 0 and not args.no_speculation:
            correct = sim["step_tokens"] - sim["steps"]
            proposed = sim["steps"] * (args.draft_tokens - 1)
            meta.update(
                spec_accept_rate=correct / proposed,
                spec_accept_length=sim["completion"] / sim["steps"],
                spec_num_correct_drafts=correct,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=sim["steps"],
            )
            state.last_accept_length = sim["step_tokens"] / sim["steps"]
            state.last_accept_rate = correct / proposed
        words = " ".join(f"tok{i}" for i in range(sim["completion"]))
        return {
            "id": rid,
            "object": "chat.completion",
            "created": 1700000000,
            "model": body.get("model", "default"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": words, "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                    **({"meta_info": meta} if body.get("return_meta_info") else {}),
                    # return_token_ids: the generated ids (the fake's are 0..n-1, as its words are tok0..).
                    **(
                        {"response_token_ids": list(range(sim["completion"]))}
                        if body.get("return_token_ids")
                        else {}
                    ),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + sim["completion"],
                "completion_tokens": sim["completion"],
                "prompt_tokens_details": None,
                "reasoning_tokens": 0,
            },
            "metadata": {"weight_version": "default"},
        }

    def server_info(self) -> dict:
        state = self.state
        with state.lock:
            internal: dict = {"world_size": 1, "last_gen_throughput": 0.0}
            if state.steps and not state.args.no_speculation:
                internal["avg_spec_accept_length"] = state.step_tokens / state.steps
        return {
            "model_path": state.args.model_name,
            "served_model_name": state.args.model_name,
            "speculative_algorithm": state.args.algorithm,
            "speculative_num_draft_tokens": state.args.draft_tokens,
            "internal_states": [internal],
            "version": "0.5.23",
            "frontend": "python",
        }

    def metrics(self) -> str:
        state, model = self.state, self.state.args.model_name
        sched = f'engine_type="unified",model_name="{model}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        tok = f'engine_type="unified",is_streaming="false",model_name="{model}"'
        with state.lock:
            lines = [
                "# HELP python_gc_objects_collected_total Objects collected during gc",
                "# TYPE python_gc_objects_collected_total counter",
                'python_gc_objects_collected_total{generation="0"} 12.0',
                "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding "
                "(accepted drafts + bonus token per forward).",
                "# TYPE sglang:spec_accept_length gauge",
                f"sglang:spec_accept_length{{{sched}}} {float(state.last_accept_length)!r}",
                "# HELP sglang:spec_accept_rate Speculative acceptance rate "
                "(`accepted drafts / proposed drafts` in batch).",
                "# TYPE sglang:spec_accept_rate gauge",
                f"sglang:spec_accept_rate{{{sched}}} {float(state.last_accept_rate)!r}",
                "# HELP sglang:num_running_reqs The number of running requests.",
                "# TYPE sglang:num_running_reqs gauge",
                f"sglang:num_running_reqs{{{sched}}} 0.0",
                "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
                "# TYPE sglang:generation_tokens_total counter",
                f"sglang:generation_tokens_total{{{tok}}} {float(state.generated)!r}",
                "# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.",
                "# TYPE sglang:spec_verify_calls_total counter",
                f'sglang:spec_verify_calls_total{{engine_type="unified",model_name="{model}"}} '
                f"{float(state.steps)!r}",
                "# HELP sglang:num_requests_total Number of requests processed.",
                "# TYPE sglang:num_requests_total counter",
                f"sglang:num_requests_total{{{tok}}} {float(state.answered)!r}",
            ]
        return "\n".join(lines) + "\n"

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write("fake-sglang: " + (format % args) + "\n")
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--accept-lengths", default="3,2,4", help="tokens per verify step, per request in turn")
    p.add_argument("--draft-tokens", type=int, default=4, help="SGLang's speculative_num_draft_tokens")
    p.add_argument("--algorithm", default="DFLASH")
    p.add_argument("--model-name", default="fake-target")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--die-after", type=int, default=None)
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--never-healthy", action="store_true")
    p.add_argument("--pid-file", default=None)
    p.add_argument("--no-speculation", action="store_true", help="answer as a server without a draft")
    args = p.parse_args(argv)
    if args.draft_tokens < 2:
        p.error("--draft-tokens must be at least 2")
    if args.pid_file:
        with open(args.pid_file, "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.state = State(args)  # type: ignore[attr-defined]
    sys.stderr.write(f"fake-sglang: listening on {args.host}:{args.port}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
