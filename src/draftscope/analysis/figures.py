"""The report's figures as PNG bytes (matplotlib, Agg; no pyplot, so no global state and no display needed).

Each function takes loaded runs and returns PNG bytes, or None when the figure has nothing to show (e.g. the
acceptance-length histogram without a speculative run). Partial runs are drawn like the others, labelled partial.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from draftscope.analysis.load import Run

DPI = 100


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # No software/version stamp: the same data gives the same bytes on the same matplotlib.
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def label(run: Run) -> str:
    return run.run_id + (" (partial)" if run.partial else "")


def throughput_by_prompt(runs: Sequence[Run]) -> bytes:
    """Median request tok/s per prompt (bars: min–max over repeats), one series per run."""
    order: dict[str, str] = {}
    for run in runs:
        for sha, rows in run.by_prompt.items():
            order.setdefault(sha, rows.prompt_id)
    fig = Figure(figsize=(max(6.0, 0.55 * len(order) + 2), 4.2))
    ax = fig.add_subplot()
    x = np.arange(len(order))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        xs, med, lo, hi = [], [], [], []
        for j, sha in enumerate(order):
            rows = run.by_prompt.get(sha)
            if rows is None:
                continue
            values = [r["request_tok_s"] for r in rows.records]
            m = float(np.median(values))
            xs.append(x[j] + (i - (len(runs) - 1) / 2) * width)
            med.append(m)
            lo.append(m - min(values))
            hi.append(max(values) - m)
        ax.errorbar(xs, med, yerr=[lo, hi], fmt="o", capsize=2, markersize=4, label=label(run))
    ax.set_xticks(x, list(order.values()), rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("request tok/s (median, min–max)")
    ax.set_title("Per-prompt throughput by run")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def token_gaps_ms(run: Run) -> np.ndarray:
    """Differences of consecutive token timestamps, in ms, over every record that has timestamps."""
    gaps = [
        np.diff(np.asarray(r["token_timestamps"], dtype=float)) for r in run.records if r["token_timestamps"]
    ]
    return np.concatenate(gaps) * 1e3 if gaps else np.array([])


def token_latency_cdf(runs: Sequence[Run]) -> bytes:
    """Empirical CDF of per-token latency (time between consecutive tokens of a request)."""
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    drawn = 0
    upper = 0.0
    for run in runs:
        gaps = np.sort(token_gaps_ms(run))
        if gaps.size == 0:
            continue
        drawn += 1
        upper = max(upper, float(np.percentile(gaps, 99)))
        ax.step(
            gaps, np.arange(1, gaps.size + 1) / gaps.size, where="post", label=f"{label(run)} (n={gaps.size})"
        )
    if drawn:
        ax.set_xlim(0, upper * 1.05 or 1.0)
        ax.legend(fontsize=8)
    else:
        ax.text(
            0.5, 0.5, "no run recorded per-token timestamps", ha="center", va="center", transform=ax.transAxes
        )
    ax.set_xlabel("time between consecutive tokens (ms; axis cut at the 99th percentile)")
    ax.set_ylabel("fraction of tokens")
    ax.set_title("Per-token latency CDF")
    ax.grid(alpha=0.3)
    return _png(fig)


def acceptance_histogram(runs: Sequence[Run]) -> bytes | None:
    """Tokens produced per verification step, for the speculative runs; None when no run is speculative."""
    spec = [r for r in runs if r.speculative]
    if not spec:
        return None
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    top = max(n for run in spec for r in run.records for n in (r.get("acceptance_lengths") or [1]))
    bins = np.arange(0.5, top + 1.5)
    for run in spec:
        lengths = [n for r in run.records for n in (r.get("acceptance_lengths") or [])]
        if not lengths:
            continue
        # The pooled mean leads (docs/use/benchmarks.md, "Acceptance"): the median of whole numbers hides the tail.
        mean = float(np.mean(lengths))
        bars = ax.hist(
            lengths,
            bins=bins,
            alpha=0.6,
            density=True,
            label=f"{label(run)} (mean {mean:.2f}, median {np.median(lengths):g})",
        )
        ax.axvline(mean, linestyle="--", linewidth=1.2, color=bars[2][0].get_facecolor())
    ax.set_xlabel("acceptance length (accepted draft tokens + 1 per verification step)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Acceptance length (dashed: the mean over steps)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def timeline(run: Run) -> bytes:
    """Record index vs request throughput, with the cumulative request time: drift, warm-up and stalls show here."""
    fig = Figure(figsize=(7.0, 3.8))
    ax = fig.add_subplot()
    index = np.arange(len(run.records))
    tok_s = [r["request_tok_s"] for r in run.records]
    ax.plot(index, tok_s, "o-", markersize=3, linewidth=0.8, label="request tok/s")
    ax.set_xlabel("record index (in the order written)")
    ax.set_ylabel("request tok/s")
    for i in range(1, len(run.records)):
        if run.records[i]["repeat"] != run.records[i - 1]["repeat"]:
            ax.axvline(i - 0.5, color="grey", alpha=0.3, linewidth=0.8)
    twin = ax.twinx()
    twin.plot(
        index, np.cumsum([r["request_seconds"] for r in run.records]), color="tab:orange", linewidth=1.0
    )
    twin.set_ylabel("cumulative request time (s)", color="tab:orange")
    ax.set_title(f"Timeline of {label(run)} (grey lines: next repeat)")
    ax.grid(alpha=0.3)
    if not run.records:
        ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes)
    return _png(fig)


def comparison_figure(doc: Mapping[str, Any]) -> bytes:
    """Per-prompt latency ratios with their median, its interval, the admission limit and the A/A noise band."""
    rows = sorted(doc["per_prompt"], key=lambda r: r["ratio"])
    fig = Figure(figsize=(max(6.0, 0.5 * len(rows) + 2.5), 4.2))
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    noise = doc.get("noise_band")
    if noise and noise.get("half_width") is not None:
        w = noise["half_width"]
        ax.axhspan(1 - w, 1 + w, color="grey", alpha=0.15, label=f"A/A noise band ±{w:.2%}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(
        1 - doc["threshold"],
        color="tab:red",
        linestyle="--",
        label=f"admission limit 1 − {doc['threshold']:.2%}",
    )
    ax.plot(x, [r["ratio"] for r in rows], "o", label="per-prompt ratio")
    if doc.get("median_ratio") is not None:
        ax.axhline(
            doc["median_ratio"], color="tab:blue", linewidth=1.2, label=f"median {doc['median_ratio']:.4f}"
        )
    if doc.get("ci"):
        ax.axhspan(doc["ci"]["low"], doc["ci"]["high"], color="tab:blue", alpha=0.15, label="95% interval")
    ax.set_xticks(x, [r["prompt_id"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("request latency, candidate / base")
    verdict = doc["verdict"]["decision"].replace("_", " ")
    ax.set_title(f"{doc['candidate']['run_id']} vs {doc['base']['run_id']}: {verdict}")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)
