"""bench in the container: every prompt × repeats, greedy, round-robin over the SGLang instances; acceptance
per instance and overall, written to `bench/bench.json` (schema `stage-bench`).

Acceptance length (per instance and overall) is the exact run mean, Σ completion_tokens / Σ spec_verify_ct over
the requests that report a verify count — SGLang's own per-request formula applied to the whole run, so long and
short requests weigh by their verify steps, not by their tokens. When no request reports `spec_verify_ct` it falls
back to the plain mean of the per-request `spec_accept_length`. Both count the bonus token; the first output token
(from the prefill, not a verify step) is in `completion_tokens` too, which lifts the figure by 1 / verify steps per
request, exactly as SGLang's figure.

Acceptance rate: accepted drafted tokens / drafted tokens. SGLang 0.5.23 defines it so in
`scheduler_components/metrics_reporter.py` (`num_correct_drafts / (forward_ct × (speculative_num_draft_tokens −
1))`) and per request in `tokenizer_manager.py`; a verify step commits its correct drafts plus one bonus token, so
rate = (accept length − 1) / (drafted tokens per step). The drafted tokens per step are
`speculative_num_draft_tokens − 1`: DFLASH's window is the block B (`--speculative-num-draft-tokens B`), so B − 1;
DSPARK's `--speculative-dspark-block-size γ` sets the window to γ + 1 (`_handle_dspark` in
`sglang/srt/arg_groups/speculative_hook.py`: "speculative_num_draft_tokens must equal gamma + 1"), so γ. bench's
`--draft-tokens` is B for DFLASH and γ for DSPARK. The rate is computed from SGLang's own counts, Σ
spec_num_correct_drafts / Σ spec_num_proposed_drafts, when every measured request reports them (they are exact:
no prefill token in them); otherwise from the mean acceptance length by the formula above, capped at 1.

Cross-checks, recorded per instance and never mixed into the means: `GET /server_info` →
`internal_states[0].avg_spec_accept_length` (cumulative accepted tokens / verify steps since start, folded in at
each decode log window: it lags and excludes the prefill token), and `GET /metrics`, parsed with
prometheus_client's text parser, every `sglang:*` sample as `{"name{labels}": value}` — the
`sglang:spec_accept_length` / `sglang:spec_accept_rate` gauges there cover only the last logging window.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core import acceptance
from draftscope.core.errors import UserError
from draftscope.core.jsonio import JsonlAppender
from draftscope.pipeline import servers, sglang, sglang_cpu
from draftscope.pipeline.base import NOTES, Command


def add_arguments(p: argparse.ArgumentParser) -> None:
    sglang.common_arguments(p)
    p.add_argument("--prompts", required=True, help="the prompt file (schema prompts)")
    p.add_argument("--output", required=True, help="where to write bench/bench.json (schema stage-bench)")
    p.add_argument("--draft", choices=sglang.DRAFTS, required=True)
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=None,
        help="DFLASH: the block size B; DSPARK: gamma (drafted tokens per step); STANDALONE: the verify window "
        "(drafted tokens + 1)",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight per instance")


@dataclass(frozen=True)
class _Job:
    seq: int
    prompt_id: str
    repeat: int
    instance: int
    messages: tuple[dict[str, str], ...]


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Every prompt × repeats, greedy, round-robin over the instances; acceptance per instance and overall."""
    for name in ("max_new_tokens", "repeats", "concurrency"):
        if getattr(args, name) < 1:
            raise UserError(
                "must be at least 1", field=f"--{name.replace('_', '-')}", value=getattr(args, name)
            )
    commands = sglang.server_commands(args.commands)
    algorithm = sglang.speculative_algorithm(args.algorithm, commands)
    drafted = _drafted_per_step(algorithm, args.draft_tokens, commands)
    prompts = sglang.load_prompts(args.prompts)
    jobs = [
        _Job(seq, p["id"], r, seq % len(commands), tuple(p["messages"]))
        for seq, (r, p) in enumerate((r, p) for r in range(args.repeats) for p in prompts)
    ]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    rows_path = output.parent / "requests.jsonl"
    rows_path.unlink(missing_ok=True)  # a rerun measures again from scratch

    with (
        servers.serving(
            commands,
            logs=sglang.logs_dir(args),
            stage="bench",
            startup_timeout=args.startup_timeout,
            health_path=sglang.HEALTH_PATH,
        ) as group,
        JsonlAppender(rows_path) as sink,
    ):
        print(
            f"bench: {len(jobs)} request(s) over {len(group.running)} instance(s), "
            f"concurrency {args.concurrency} each"
        )
        rows = _run_jobs(group, jobs, args.max_new_tokens, args.concurrency, sink.append)
        scraped = [_scrape(group, i) for i in range(len(group.running))]
        urls = group.urls

    instances = []
    for index, url in enumerate(urls):
        mine = [r for r in rows if r["instance"] == index]
        server_avg, metrics = scraped[index]
        instances.append(
            {
                "index": index,
                "url": url,
                "requests": len(mine),
                "mean_accept_length": _mean_accept_length(mine),
                "server_avg_accept_length": server_avg,
                "metrics": metrics,
            }
        )
    mean = _mean_accept_length(rows)
    result: dict[str, Any] = {
        "schema_version": sglang.SCHEMA_VERSION,
        "draft": args.draft,
        "algorithm": algorithm,
        "requests": len(rows),
        "mean_accept_length": mean,
        "accept_rate": _accept_rate(rows, mean, drafted),
        "instances": instances,
        "per_request": [
            {
                k: r[k]
                for k in (
                    "prompt_id",
                    "instance",
                    "completion_tokens",
                    "spec_accept_length",
                    "spec_verify_ct",
                )
            }
            for r in rows
        ],
    }
    if drafted is not None:
        result["draft_tokens_per_step"] = drafted
    # The kit's acceptance ledger over the same rows (core/acceptance.py): every backend's figures, one definition.
    result["acceptance"] = acceptance.from_sglang(rows, drafted)
    sglang.write_checked(output, result, "stage-bench")
    print(
        f"bench: mean accept length {sglang.fmt(mean)}, accept rate {sglang.fmt(result['accept_rate'])} "
        f"over {len(rows)} request(s); results in {output}"
    )
    counts: dict[str, Any] = {"requests": len(rows), "instances": len(instances)}
    if sglang_cpu.on_cpu_engine(commands):
        counts[NOTES] = [sglang_cpu.engine_note()]
    for key in ("mean_accept_length", "accept_rate"):
        if result[key] is not None:
            counts[key] = result[key]
    return counts


def _run_jobs(
    group: servers.ServerGroup,
    jobs: Sequence[_Job],
    max_new_tokens: int,
    concurrency: int,
    sink: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Run the jobs, `concurrency` in flight per instance; each row goes to `sink` as it arrives. The first
    failure cancels what has not started and fails the stage."""
    pools = [
        ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"bench-{i}")
        for i in range(len(group.running))
    ]
    rows: list[dict[str, Any]] = []
    try:
        futures: dict[Future, _Job] = {
            pools[job.instance].submit(_one_request, group, job, max_new_tokens): job for job in jobs
        }
        for future in as_completed(futures):
            row = future.result()
            sink(row)
            rows.append(row)
    finally:
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
    return sorted(rows, key=lambda r: r["seq"])


def _one_request(group: servers.ServerGroup, job: _Job, max_new_tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    reply = sglang.post_with_retries(
        group,
        job.instance,
        sglang.chat_body(list(job.messages), max_new_tokens),
        what=f"prompt '{job.prompt_id}' (repeat {job.repeat})",
    )
    name = group.running[job.instance].command.name
    meta = sglang.meta_info(reply, what=f"{name}'s reply to prompt '{job.prompt_id}'")
    completion = meta.get("completion_tokens")
    if completion is None:
        completion = (reply.get("usage") or {}).get("completion_tokens")
    if not isinstance(completion, int) or completion < 0:
        raise UserError(
            f"{name}'s reply to prompt '{job.prompt_id}' has no completion token count",
            field="bench.requests",
        )
    verify = meta.get("spec_verify_ct")
    accept = meta.get("spec_accept_length")
    ids = sglang.response_token_ids(reply, what=f"{name}'s reply to prompt '{job.prompt_id}'")
    return {
        "seq": job.seq,
        "prompt_id": job.prompt_id,
        "repeat": job.repeat,
        "instance": job.instance,
        "completion_tokens": completion,
        "spec_accept_length": float(accept) if isinstance(accept, int | float) else None,
        "spec_verify_ct": int(verify) if isinstance(verify, int) else None,
        "spec_num_correct_drafts": meta.get("spec_num_correct_drafts"),
        "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts"),
        "spec_accept_rate": meta.get("spec_accept_rate"),
        "finish_reason": meta.get("finish_reason"),
        "seconds": round(time.monotonic() - started, 4),
        "token_ids": ids,
    }


def _mean_accept_length(rows: Sequence[dict[str, Any]]) -> float | None:
    """Σ completion_tokens / Σ spec_verify_ct over the rows with a verify count; else the mean of the
    per-request spec_accept_length; None when no row has either (see the module docstring)."""
    counted = [r for r in rows if r.get("spec_verify_ct")]
    if counted:
        return sum(r["completion_tokens"] for r in counted) / sum(r["spec_verify_ct"] for r in counted)
    lengths = [r["spec_accept_length"] for r in rows if r.get("spec_accept_length") is not None]
    return sum(lengths) / len(lengths) if lengths else None


def _accept_rate(rows: Sequence[dict[str, Any]], mean: float | None, drafted: int | None) -> float | None:
    """Accepted drafted tokens / drafted tokens (see the module docstring)."""
    counted = [r for r in rows if r.get("spec_verify_ct")]
    if counted and all(
        isinstance(r.get("spec_num_proposed_drafts"), int)
        and isinstance(r.get("spec_num_correct_drafts"), int)
        for r in counted
    ):
        proposed = sum(r["spec_num_proposed_drafts"] for r in counted)
        if proposed > 0:
            return sum(r["spec_num_correct_drafts"] for r in counted) / proposed
    if mean is None or not drafted:
        return None
    return min(1.0, max(0.0, (mean - 1.0) / drafted))


def _drafted_per_step(algorithm: str, draft_tokens: int | None, commands: Sequence[Command]) -> int | None:
    """Drafted tokens per verify step: B − 1 for DFLASH (`--draft-tokens` = B), γ for DSPARK (= γ)."""
    if draft_tokens is None:
        flag = (
            "--speculative-dspark-block-size" if algorithm == "DSPARK" else "--speculative-num-draft-tokens"
        )
        value = sglang.argv_value(commands[0].argv, flag)
        if value is None and algorithm == "DFLASH":
            value = sglang.argv_value(commands[0].argv, "--speculative-dflash-block-size")
        draft_tokens = int(value) if value is not None and value.isdigit() else None
    if draft_tokens is None:
        return None
    # DFLASH's window and STANDALONE's --speculative-num-draft-tokens both count the target's own token.
    drafted = draft_tokens - 1 if algorithm in ("DFLASH", "STANDALONE") else draft_tokens
    if drafted < 1:
        raise UserError(
            f"{algorithm} with --draft-tokens {draft_tokens} drafts no token per step",
            field="--draft-tokens",
            value=draft_tokens,
            fix="DFLASH: the block size (at least 2); DSPARK: gamma (at least 1)",
        )
    return drafted


def _scrape(group: servers.ServerGroup, index: int) -> tuple[float | None, dict[str, float]]:
    """(`/server_info`'s cumulative avg_spec_accept_length, the `sglang:*` samples of `/metrics`). Either can be
    missing (a warning, recorded as null / {}): the per-request figures are the measurement."""
    run = group.running[index]
    server_avg: float | None = None
    try:
        info = servers.get_json(run.url + "/server_info")
        states = info.get("internal_states") if isinstance(info, dict) else None
        value = states[0].get("avg_spec_accept_length") if states and isinstance(states[0], dict) else None
        server_avg = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
    except (servers.HttpError, ValueError) as exc:
        print(f"bench: warning: {run.command.name} /server_info: {exc}")
    metrics: dict[str, float] = {}
    try:
        metrics = sglang.sglang_samples(servers.get_text(run.url + "/metrics"))
    except (servers.HttpError, ValueError) as exc:
        print(f"bench: warning: {run.command.name} /metrics: {exc}")
    return server_avg, metrics
