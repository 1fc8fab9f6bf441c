"""A record's latencies as `vllm bench serve` defines them, from the kit's per-token timestamps (seconds).

`token_timestamps[i]` is when generated token i became available, in seconds since the request started.

- TTFT: the first token's timestamp.
- ITL (inter-token latency): the gaps between successive arrivals. vLLM's client takes one per streamed chunk, and
  tokens a verification step emits together arrive as one chunk; here tokens with the same timestamp arrived
  together and count as one arrival, so a speculative run's ITLs are per step, as vLLM's are.
- TPOT: (request latency − TTFT) / (generated tokens − 1), only for more than one token (vLLM's
  `calculate_metrics`).
- Statistics are numpy's mean, median, population standard deviation and percentile (linear interpolation), the
  functions vLLM's benchmark uses.

A record without timestamps (the backend gave none) has no TTFT, ITL or TPOT: None, never a guess.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def ttft(stamps: Sequence[float] | None) -> float | None:
    return float(stamps[0]) if stamps else None


def itls(stamps: Sequence[float] | None) -> list[float] | None:
    """Seconds between successive arrivals (equal timestamps are one arrival); None without timestamps."""
    if not stamps:
        return None
    arrivals = [float(stamps[0])]
    for stamp in stamps[1:]:
        if float(stamp) != arrivals[-1]:
            arrivals.append(float(stamp))
    return [b - a for a, b in itertools.pairwise(arrivals)]


def tpot(record: Mapping[str, Any]) -> float | None:
    first = ttft(record.get("token_timestamps"))
    tokens = record["generated_tokens"]
    if first is None or tokens <= 1:
        return None
    return (float(record["request_seconds"]) - first) / (tokens - 1)


def mean(values: Sequence[float] | None) -> float | None:
    return float(np.mean(values)) if values else None


def median(values: Sequence[float] | None) -> float | None:
    return float(np.median(values)) if values else None


def std(values: Sequence[float] | None) -> float | None:
    return float(np.std(values)) if values else None


def percentile(values: Sequence[float] | None, p: float) -> float | None:
    return float(np.percentile(values, p)) if values else None
