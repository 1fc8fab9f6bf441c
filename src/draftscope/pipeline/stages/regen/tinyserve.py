"""The tiny target behind an OpenAI-compatible chat endpoint on loopback: the CPU path's regen server.

Part of the kit's CPU tooling, not a serving engine: real presets regenerate with `vllm serve` on GPUs, and this
server exists so the regen stage — its server lifecycle, sharding, retries and resume — runs for real on a CPU.
It answers the subset of vLLM's OpenAI server that the regen client uses:

- `GET /health` → 200 once the model is loaded;
- `GET /v1/models` → the served model name;
- `POST /v1/chat/completions` with `model`, `messages`, `max_tokens`, `temperature` (0 = greedy), `seed` →
  `choices[0].message.content`, `finish_reason` (`stop` at the end-of-turn token, else `length`) and `usage`.

The conversation goes through the tokenizer's own chat template with the generation prompt; decoding uses the
model's KV cache and one request at a time (a 2M-parameter model on a CPU gains nothing from batching). A bad
request gets a 400 (unknown model: 404) with an OpenAI-style error body, as vLLM answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class TinyChatModel:
    """Loads the model and tokenizer once; `chat()` answers one conversation."""

    def __init__(self, model: str, tokenizer: str, threads: int | None = None) -> None:
        # lazy: torch and transformers, only when the server starts
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=torch.float32)
        self.model.eval()
        self.max_positions = int(getattr(self.model.config, "max_position_embeddings", 2048))
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_ids = {i for i in (end, self.tokenizer.eos_token_id) if isinstance(i, int) and i >= 0}
        self.lock = threading.Lock()

    def chat(
        self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[str, str, int, int]:
        """(text, finish_reason, prompt tokens, completion tokens)."""
        torch = self.torch
        encoded = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=True
        )
        prompt = list(encoded.input_ids)
        budget = self.max_positions - len(prompt)
        if budget <= 0:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the model's context is {self.max_positions}"
            )
        generator = None
        if temperature > 0:
            generator = torch.Generator().manual_seed(seed if seed is not None else 0)
        out: list[int] = []
        finish = "length"
        with self.lock, torch.inference_mode():
            ids = torch.tensor([prompt])
            past = None
            for _ in range(min(max_tokens, budget)):
                result = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = result.past_key_values
                logits = result.logits[0, -1].float()
                if generator is None:
                    token = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                if token in self.stop_ids:
                    finish = "stop"
                    break
                out.append(token)
                ids = torch.tensor([[token]])
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        return text, finish, len(prompt), len(out)


class BadRequest(Exception):
    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: Any, served: str) -> tuple[list[dict[str, Any]], int, float, int | None]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("model") != served:
        raise BadRequest(f"The model `{body.get('model')}` does not exist.", HTTPStatus.NOT_FOUND)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise BadRequest("each message needs a string role and content")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise BadRequest("temperature must be a number >= 0")
    seed = body.get("seed")
    return messages, max_tokens, float(temperature), seed


def make_handler(model: TinyChatModel, served: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # one line per request on stderr, like uvicorn
            sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

        def send_json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def error(self, status: HTTPStatus, message: str) -> None:
            self.send_json(
                status, {"error": {"message": message, "type": status.phrase, "code": int(status)}}
            )

        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_json(200, {})
            elif self.path == "/v1/models":
                self.send_json(
                    200,
                    {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "draftscope"}]},
                )
            else:
                self.error(HTTPStatus.NOT_FOUND, f"no route {self.path}")

        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                self.error(HTTPStatus.NOT_FOUND, f"no route {self.path}")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                messages, max_tokens, temperature, seed = parse_request(body, served)
                text, finish, prompt_tokens, completion_tokens = model.chat(
                    messages, max_tokens=max_tokens, temperature=temperature, seed=seed
                )
            except BadRequest as exc:
                self.error(exc.status, str(exc))
                return
            except (ValueError, TypeError) as exc:
                self.error(HTTPStatus.BAD_REQUEST, str(exc))
                return
            self.send_json(
                200,
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": served,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": finish,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                },
            )

    return Handler


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--served-model-name", default="target")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for the tiny model)")


def main(args: argparse.Namespace) -> int:
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"error: tinyserve listens on loopback only, not {args.host}", file=sys.stderr)
        return 2
    model = TinyChatModel(args.model, args.tokenizer, args.threads)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(model, args.served_model_name))
    server.daemon_threads = True
    print(f"tinyserve: {args.served_model_name} at http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
