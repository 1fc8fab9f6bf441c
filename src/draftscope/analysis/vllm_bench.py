"""A run as the JSON `vllm bench serve --save-result` writes (vLLM 0.33.0, vllm/benchmarks/serve.py).

Only names that vLLM's own result JSON carries, filled only with what the kit measured (the contract test
tests/contract/test_vllm_bench_names.py checks every name against the pinned release's source). Units are vLLM's:
seconds for durations and per-request lists, milliseconds for the `*_ms` statistics, tokens/s for throughputs,
a percentage for `spec_decode_acceptance_rate`. docs/use/exports.md maps each field to the kit figure that fills it
and names those left out and why (no generated text, no absolute request start times, no server-side queue
times). Several runs are written one JSON object per line, as `--append-result` writes them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from draftscope.analysis import timing
from draftscope.analysis.load import Run
from draftscope.analysis.output import refuse_existing, write_new
from draftscope.core import acceptance

VLLM_VERSION = "0.33.0"  # the release whose result names these are (the GPU images' pin)
PERCENTILES = (99,)  # vLLM's default --metric-percentiles
DATE_FORMAT = "%Y%m%d-%H%M%S"  # vLLM's `date`
# The names vLLM's result JSON may carry that the kit leaves out, and why (the contract test requires every
# literal name of the release's result to be written or listed here; docs/use/exports.md shows this table).
LEFT_OUT = {
    "ramp_up_strategy": "no ramp-up: requests are sent one at a time (vLLM writes it only with --ramp-up-strategy)",
    "ramp_up_start_rps": "no ramp-up (as ramp_up_strategy)",
    "ramp_up_end_rps": "no ramp-up (as ramp_up_strategy)",
    "rps_change_events": "no ramp-up (as ramp_up_strategy)",
    "start_times": "records keep each request's own timestamps, not its absolute start time",
    "queue_times": "client-side queueing for a concurrency slot is not measured",
    "max_output_tokens_per_s": "needs absolute request times (per-second buckets), which records do not keep",
    "generated_texts": "records keep token ids, not text (the text needs the tokenizer, and exports leave it out)",
    "rtfx": "audio transcription benchmarks only",
    "total_input_sequences": "pooling (embedding) benchmarks only",
    "input_sequence_throughput": "pooling (embedding) benchmarks only",
    "diffusion_committed_throughput": "diffusion decoding only",
    "diffusion_steps_per_canvas": "diffusion decoding only",
    "diffusion_committed_per_step": "diffusion decoding only",
    "diffusion_committed_tokens": "diffusion decoding only",
    "diffusion_denoising_steps": "diffusion decoding only",
    "diffusion_canvas_positions": "diffusion decoding only",
}


def result(run: Run) -> dict[str, Any]:
    """The --save-result JSON of one run (with the per-request lists vLLM keeps under --save-detailed)."""
    records = run.records
    config = run.config
    model = run.target.split("@", 1)[0]  # the repository; its revision is in the kit's own exports
    duration = sum(float(r["request_seconds"]) for r in records)
    total_in = sum(r["prompt_tokens"] for r in records)
    total_out = sum(r["generated_tokens"] for r in records)
    out: dict[str, Any] = {
        "date": _date(run),
        "endpoint_type": config.get("backend"),
        "backend": config.get("backend"),
        "label": run.run_id,
        "model_id": model,
        "tokenizer_id": model,  # the kit tokenizes with the target's own tokenizer
        "num_prompts": len(records),
        "request_rate": "inf",  # no arrival process: each request is sent when the previous one has finished
        "burstiness": None,  # only meaningful for a finite request rate
        "max_concurrency": 1,  # batch one: one request at a time
        "duration": duration,
        "completed": len(records),
        "failed": 0,  # a request that fails ends the run; its status says so and it leaves no record
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(records) / duration if duration else None,
        "request_goodput": None,  # vLLM writes null without --goodput; the kit has no SLOs
        "output_throughput": total_out / duration if duration else None,
        "total_token_throughput": (total_in + total_out) / duration if duration else None,
        "input_lens": [r["prompt_tokens"] for r in records],
        "output_lens": [r["generated_tokens"] for r in records],
        "latencies": [float(r["request_seconds"]) for r in records],
        "errors": ["" for _ in records],  # vLLM's error text of a request that succeeded
        "max_concurrent_requests": 1 if records else 0,
    }
    out.update(_spec_decode(records))
    out.update(_latency_fields(records))
    return out


def _date(run: Run) -> str | None:
    stamp = run.manifest.get("started_at") or run.manifest.get("created_at")
    if not stamp:
        return None
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return moment.astimezone(UTC).strftime(DATE_FORMAT)


def _spec_decode(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's spec-decode block (its counters' delta over the benchmark), from the kit's acceptance ledger."""
    ledger = acceptance.from_records(records)
    if ledger is None or not ledger["proposed_drafts"]:
        return {}  # vLLM writes the block only when drafts were proposed
    return {
        "spec_decode_acceptance_rate": ledger["rate"] * 100,  # a percentage in vLLM
        "spec_decode_acceptance_length": ledger["mean_pooled"],  # 1 + accepted / drafts
        "spec_decode_num_drafts": ledger["steps"],
        "spec_decode_draft_tokens": ledger["proposed_drafts"],
        "spec_decode_accepted_tokens": ledger["accepted_drafts"],
        "spec_decode_per_position_acceptance_rates": _per_position(records, ledger["steps"]),
    }


def _per_position(records: Sequence[dict[str, Any]], steps: int) -> list[float] | None:
    """vLLM's per-position rates: steps that accepted draft position i, over all steps. Needs per-step lengths."""
    lengths = [r.get("acceptance_lengths") for r in records]
    if not steps or not all(lengths):
        return None
    top = max(max(n - 1 for n in row) for row in lengths if row)
    width = max(top, max((r.get("draft_tokens_per_step") or 0) for r in records))
    hits = [sum(1 for row in lengths for n in row if n - 1 >= i) for i in range(1, width + 1)]
    return [h / steps for h in hits]


def _latency_fields(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """TTFT, TPOT, ITL and E2EL: per-request lists (seconds) and mean/median/std/p99 (ms), as vLLM names them."""
    latencies = [float(r["request_seconds"]) for r in records]
    out: dict[str, Any] = {}
    stamps = [r.get("token_timestamps") for r in records]
    if records and all(stamps):
        ttfts = [timing.ttft(s) for s in stamps]
        itls = [timing.itls(s) or [] for s in stamps]
        tpots = [t for r in records if (t := timing.tpot(r)) is not None]
        out["ttfts"] = ttfts
        out["itls"] = itls
        out.update(_stats("ttft", ttfts))
        out.update(_stats("tpot", tpots))
        out.update(_stats("itl", [gap for row in itls for gap in row]))
    out.update(_stats("e2el", latencies))
    return out


def _stats(metric: str, seconds: Sequence[float]) -> dict[str, Any]:
    values = list(seconds) or [0.0]  # vLLM: `np.mean(values or 0)`
    out = {
        f"mean_{metric}_ms": timing.mean(values) * 1000,
        f"median_{metric}_ms": timing.median(values) * 1000,
        f"std_{metric}_ms": timing.std(values) * 1000,
    }
    for p in PERCENTILES:
        out[f"p{p}_{metric}_ms"] = timing.percentile(values, p) * 1000
    return out


def export_vllm_bench(runs: Sequence[Run], output: Path) -> int:
    """Write one result JSON per run, one per line (`--append-result`'s layout); the number of runs written."""
    refuse_existing(output, "--output")
    lines = [json.dumps(result(run), ensure_ascii=False, allow_nan=False) for run in runs]
    write_new(output, "\n".join(lines).encode("utf-8") + b"\n", "--output")
    return len(lines)
