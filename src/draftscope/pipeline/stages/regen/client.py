"""The regen stage's in-container part: start the target servers, regenerate every row, account for every row.

Rows are JSON Lines `{"id": str, "messages": [...]}`. The prompt is the conversation without its final assistant
turn (if it has one); the target's reply replaces that turn. Row k of the input goes to instance k mod N — a shard
that does not depend on what earlier attempts finished — and each instance gets at most `--concurrency` requests
in flight.

Requests are OpenAI chat completions. A 408/409/425/429/5xx answer, a refused or dropped connection, or a timeout
is retried with exponential backoff and jitter, up to `--max-retries` times; any other answer (a 4xx: the request
itself is wrong) fails the row at once. A failed row goes to `errors.jsonl` with its last status and message.

Resume. `rows.jsonl` is append-only, one `write()` per row, and is the record of what is done: a rerun reads it
(cutting a torn last line that a kill left behind), skips those ids, and retries every other row — including the
previous attempt's errors, whose file is kept as `errors.attempt-K.jsonl` first. The stage ends by recounting from
the files: `ok + errors == input` with no id twice, or it fails naming the missing rows.

Over ~400 lines on purpose: serving, retrying and resuming share one row ledger (rows.jsonl), and its accounting
is checked as one.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import JsonlAppender, atomic_write_json, iter_jsonl, parse_json, repair_tail
from draftscope.pipeline.servers import HttpError, load_commands, request, retryable, serving, url_of
from draftscope.tiny.assets import stage_for_vllm

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
MISSING_SHOWN = 10


@dataclass(frozen=True)
class Sampling:
    model: str
    max_tokens: int
    temperature: float
    seed: int

    def body(self, messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Row:
    position: int
    id: str
    data: dict[str, Any]

    def prompt(self) -> list[dict[str, Any]]:
        messages = list(self.data["messages"])
        if messages and messages[-1].get("role") == "assistant":
            messages = messages[:-1]
        return messages


@dataclass
class Tally:
    ok: int = 0
    errors: int = 0
    retries: int = 0
    per_instance: dict[int, int] = field(default_factory=dict)


# --- input and resume -------------------------------------------------------------------------------------------


def read_rows(path: Path, max_rows: int | None = None) -> list[Row]:
    """The input rows, checked: an id, unique; messages with a role and content; something to answer."""
    rows: list[Row] = []
    seen: set[str] = set()
    # The reading boundary: a regular file (never a FIFO), streamed, each line within its limits; a hand-written
    # file may lack its last newline.
    lines = iter_jsonl(path, final_newline=False)
    try:
        for number, data in lines:
            if max_rows is not None and len(rows) >= max_rows:
                break
            where = f"{path}:{number}"
            if not isinstance(data, dict) or "id" not in data:
                raise UserError(
                    "a chat row needs an 'id'", source=where, fix='{"id": ..., "messages": [...]}'
                )
            messages = data.get("messages")
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            ):
                raise UserError(
                    "messages must be a list of {role, content} strings", source=where, field="messages"
                )
            row = Row(len(rows), str(data["id"]), data)
            if row.id in seen:
                raise UserError(f"duplicate row id {row.id!r}", source=where, field="id")
            if not row.prompt():
                raise UserError("nothing to answer: no message before the final assistant turn", source=where)
            seen.add(row.id)
            rows.append(row)
    finally:
        lines.close()
    if not rows:
        raise UserError("no chat rows", source=str(path))
    return rows


def ids_in(path: Path) -> Iterator[str]:
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row_id = str(parse_json(line, str(path), line=number, expect=dict)["id"])
            except (UserError, KeyError):
                raise UserError(
                    f"line {number} is not a regen record",
                    source=str(path),
                    fix="move the file away to regenerate from scratch",
                ) from None
            yield row_id


def done_ids(rows_file: Path, wanted: set[str]) -> set[str]:
    repair_tail(rows_file)
    done: set[str] = set()
    for row_id in ids_in(rows_file):
        if row_id in done:
            raise UserError(
                f"row {row_id!r} is in the output twice",
                source=str(rows_file),
                fix="remove the duplicate line (the file was changed outside the kit)",
            )
        done.add(row_id)
    stray = done - wanted
    if stray:
        raise UserError(
            f"{len(stray)} output row(s) are not in the input (e.g. {sorted(stray)[0]!r})",
            source=str(rows_file),
            fix="the input changed since the last attempt: use another --workdir, or --force after moving regen/",
        )
    return done


def rotate_errors(errors_file: Path) -> Path | None:
    """Keep the previous attempt's errors under a new name; this attempt retries those rows."""
    if not errors_file.is_file() or errors_file.stat().st_size == 0:
        errors_file.unlink(missing_ok=True)
        return None
    k = 1
    while (kept := errors_file.with_name(f"errors.attempt-{k}.jsonl")).exists():
        k += 1
    errors_file.rename(kept)
    return kept


# --- requests ---------------------------------------------------------------------------------------------------


class RowFailed(Exception):
    def __init__(self, message: str, status: int | None, attempts: int) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


def backoff(attempt: int, rng: random.Random) -> float:
    return min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt) * (0.5 + rng.random() / 2)


def complete(
    url: str,
    body: dict[str, Any],
    *,
    timeout: float,
    max_retries: int,
    stop: threading.Event,
    rng: random.Random,
    on_retry: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], int]:
    """POST a chat completion with retries; returns (response, attempts) or raises RowFailed."""
    attempt = 0
    while True:
        status: int | None
        try:
            status, raw = request("POST", f"{url}/v1/chat/completions", body, timeout=timeout)
            message = f"HTTP {status}: {raw.decode('utf-8', 'replace')[:300]}"
        except HttpError as exc:
            status, message = None, str(exc)
        if status == 200:
            try:
                response = json.loads(raw)
                if not isinstance(response["choices"][0]["message"]["content"], str):
                    raise TypeError("content is not a string")
                return response, attempt + 1
            except (ValueError, KeyError, IndexError, TypeError):
                raise RowFailed(f"not a chat completion: {raw[:300]!r}", status, attempt + 1) from None
        if not retryable(status) or attempt >= max_retries or stop.is_set():
            raise RowFailed(message, status, attempt + 1)
        on_retry()
        if stop.wait(backoff(attempt, rng)):
            raise RowFailed(message + " (stopped)", status, attempt + 1)
        attempt += 1


def output_row(row: Row, response: dict[str, Any], instance: int, attempts: int) -> dict[str, Any]:
    choice = response["choices"][0]
    usage = response.get("usage") or {}
    out = {k: v for k, v in row.data.items() if k != "messages"}
    out["id"] = row.id
    out["messages"] = [*row.prompt(), {"role": "assistant", "content": choice["message"]["content"]}]
    out["regen"] = {
        "instance": instance,
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": usage.get("completion_tokens"),
        "attempts": attempts,
    }
    return out


def regenerate(
    rows: Sequence[Row],
    urls: Sequence[str],
    sampling: Sampling,
    out_dir: Path,
    *,
    concurrency: int,
    max_retries: int,
    timeout: float,
    seed: int = 0,
    say: Callable[[str], None] = print,
    check: Callable[[], None] = lambda: None,
) -> Tally:
    """Send every pending row to its instance; append results and errors as they come."""
    rows_file, errors_file = out_dir / "rows.jsonl", out_dir / "errors.jsonl"
    lock = threading.Lock()
    stop = threading.Event()
    tally = Tally(per_instance={i: 0 for i in range(len(urls))})
    total = len(rows)
    started = time.monotonic()

    def work(row: Row, instance: int, writer: JsonlAppender, errors: JsonlAppender) -> None:
        if stop.is_set():
            return
        rng = random.Random(f"{seed}:{row.id}")

        def retried() -> None:
            with lock:
                tally.retries += 1

        try:
            response, attempts = complete(
                urls[instance],
                sampling.body(row.prompt()),
                timeout=timeout,
                max_retries=max_retries,
                stop=stop,
                rng=rng,
                on_retry=retried,
            )
        except RowFailed as exc:
            if stop.is_set():
                return  # interrupted: not an error of the row; the next attempt sends it again
            with lock:
                errors.append(
                    {
                        "id": row.id,
                        "instance": instance,
                        "status": exc.status,
                        "attempts": exc.attempts,
                        "error": str(exc),
                    }
                )
                tally.errors += 1
            return
        record = output_row(row, response, instance, attempts)
        with lock:
            writer.append(record)
            tally.ok += 1
            tally.per_instance[instance] += 1
            finished = tally.ok + tally.errors
            if finished == total or finished % max(1, total // 10) == 0:
                say(
                    f"regen: {finished}/{total} rows ({tally.errors} errors) in {time.monotonic() - started:.0f} s"
                )

    out_dir.mkdir(parents=True, exist_ok=True)
    executors = [ThreadPoolExecutor(concurrency, thread_name_prefix=f"regen-{i}") for i in range(len(urls))]
    futures: list[Future] = []
    try:
        with JsonlAppender(rows_file) as writer, JsonlAppender(errors_file) as errors:
            for row in rows:
                instance = row.position % len(urls)
                futures.append(executors[instance].submit(work, row, instance, writer, errors))
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=2.0, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()  # a bug in the client surfaces here
                check()
    except BaseException:
        stop.set()
        for executor in executors:
            executor.shutdown(wait=False, cancel_futures=True)
        raise
    for executor in executors:
        executor.shutdown(wait=True)
    return tally


# --- the stage --------------------------------------------------------------------------------------------------


def account(rows: Sequence[Row], out_dir: Path) -> tuple[set[str], set[str], list[str]]:
    """Recount from the files: ok ids, error ids, missing ids (in input order). A row in both is an error."""
    wanted = {r.id for r in rows}
    ok = done_ids(out_dir / "rows.jsonl", wanted)
    errors: set[str] = set()
    for row_id in ids_in(out_dir / "errors.jsonl"):
        if row_id in ok or row_id in errors:
            raise UserError(f"row {row_id!r} is accounted for twice", source=str(out_dir / "errors.jsonl"))
        errors.add(row_id)
    missing = [r.id for r in rows if r.id not in ok and r.id not in errors]
    return ok, errors, missing


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--commands", required=True, help="the stage's commands file (the target servers)")
    p.add_argument("--input", required=True, help="chat rows, JSON Lines")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight per instance")
    p.add_argument("--max-retries", type=int, default=5)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--startup-timeout", type=float, default=1800.0)
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--logs", default=None, help="server logs (default: logs/ beside the stages folder)")
    p.add_argument("--shard", type=int, default=None, help="with --shards N: rows k, k mod N == SHARD")
    p.add_argument("--shards", type=int, default=None, help="how many shards the rows are split into")
    p.add_argument(
        "--stage-tiny-target",
        default=None,
        help="stage the shipped tiny target with its tokenizer here (hash-checked) before the servers start",
    )


def shard_rows(rows: Sequence[Row], shard: int | None, shards: int | None) -> list[Row]:
    """The rows of one shard: input rows k with k mod `shards` == `shard`, renumbered from 0, so that the shard's
    rows spread over its own instances as a whole run's do (row k of the shard → instance k mod N)."""
    if shard is None or shards is None or shards < 1 or not 0 <= shard < shards:
        raise UserError("--shard I needs --shards N with 0 <= I < N", field="--shard", value=(shard, shards))
    return [Row(j, r.id, r.data) for j, r in enumerate(r for r in rows if r.position % shards == shard)]


def main(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.output_dir)
    commands = load_commands(args.commands)
    logs = Path(args.logs) if args.logs else Path(args.commands).parent.parent / "logs"
    rows = read_rows(Path(args.input), args.max_rows)
    if args.shard is not None or args.shards is not None:
        rows = shard_rows(rows, args.shard, args.shards)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = done_ids(out_dir / "rows.jsonl", {r.id for r in rows})
    kept = rotate_errors(out_dir / "errors.jsonl")
    pending = [r for r in rows if r.id not in done]
    sampling = Sampling(args.model, args.max_tokens, args.temperature, args.seed)
    print(
        f"regen: {len(rows)} rows, {len(done)} done before, {len(pending)} to send"
        + (f" (previous errors kept in {kept.name})" if kept else ""),
        flush=True,
    )
    tally = Tally()
    if pending:
        if args.stage_tiny_target:
            stage_for_vllm(Path(args.stage_tiny_target), "target")
        with serving(commands, logs=logs, stage="regen", startup_timeout=args.startup_timeout) as group:
            urls = [url_of(c) for c in group.commands]
            tally = regenerate(
                pending,
                urls,
                sampling,
                out_dir,
                concurrency=args.concurrency,
                max_retries=args.max_retries,
                timeout=args.request_timeout,
                seed=args.seed,
                check=group.check_alive,
            )
    else:
        urls = [url_of(c) for c in commands if c.port is not None]
    ok, errors, missing = account(rows, out_dir)
    per_instance = {i: 0 for i in range(len(urls))}
    for row in rows:
        if row.id in ok:
            per_instance[row.position % max(1, len(urls))] += 1
    summary = {
        "schema_version": 1,
        "input": len(rows),
        "ok": len(ok),
        "errors": len(errors),
        "missing": missing,
        "instances": [{"index": i, "url": u, "rows": per_instance[i]} for i, u in enumerate(urls)],
        "sampling": {
            "model": sampling.model,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "seed": sampling.seed,
        },
    }
    atomic_write_json(out_dir / "summary.json", summary)
    print(
        f"regen: ok {len(ok)} + errors {len(errors)} of {len(rows)} input rows; {tally.retries} retries",
        flush=True,
    )
    if missing:
        shown = ", ".join(missing[:MISSING_SHOWN]) + (" …" if len(missing) > MISSING_SHOWN else "")
        raise UserError(
            f"{len(missing)} row(s) have neither a reply nor an error: {shown}",
            fix="rerun the stage; it resumes by row id",
        )
    if rows and not ok:  # (a shard can be empty: fewer rows than shards)
        raise UserError(
            f"every row failed; see {out_dir / 'errors.jsonl'}", fix="read the server logs in logs/"
        )
    return {
        "input": len(rows),
        "ok": len(ok),
        "errors": len(errors),
        "retries": tally.retries,
        "resumed": len(done),
    }
