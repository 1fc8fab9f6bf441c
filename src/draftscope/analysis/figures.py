"""The report's figures as PNG bytes (matplotlib, Agg; no pyplot, so no global state and no display needed).

Each function takes loaded runs (or comparison documents) and returns PNG bytes, or None when the figure has nothing
to show (e.g. the acceptance-length histogram without a speculative run); its `draw_*` twin returns the Figure
itself, whose axes the tests read. Partial runs are drawn like the others, labelled partial. Counts get whole-number
ticks, ratios a log axis, and series that may coincide a hatching, line style or marker each.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from draftscope.analysis.load import Run

DPI = 100
# Series of different runs are told apart by more than colour: a hatching, a line style, a marker each.
HATCHES = ("", "//", "\\\\", "xx", "..", "++")
LINESTYLES = ("--", ":", "-.", (0, (5, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P")


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
        marker = MARKERS[i % len(MARKERS)]
        ax.errorbar(xs, med, yerr=[lo, hi], fmt=marker, capsize=2, markersize=4, label=label(run))
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
        upper = max(upper, float(np.percentile(gaps, 99)))
        ax.step(
            gaps,
            np.arange(1, gaps.size + 1) / gaps.size,
            where="post",
            linestyle=("-", *LINESTYLES)[drawn % (len(LINESTYLES) + 1)],  # curves that coincide stay visible
            label=f"{label(run)} (n={gaps.size})",
        )
        drawn += 1
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


def draw_acceptance(runs: Sequence[Run]) -> Figure | None:
    """Tokens produced per verification step, for the speculative runs; None when no run is speculative.

    Bars of different runs stand side by side with their own hatching (runs with the same draft often have the
    very same lengths, and overlaid bars would hide one another); a run whose lengths equal an earlier run's says
    so in the legend."""
    spec = [r for r in runs if r.speculative]
    if not spec:
        return None
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    series = [
        (run, np.asarray(lengths, dtype=int))
        for run in spec
        if (lengths := [n for r in run.records for n in (r.get("acceptance_lengths") or [])])
    ]
    top = max((int(lengths.max()) for _, lengths in series), default=1)
    values = np.arange(1, top + 1)
    width = 0.8 / max(1, len(series))
    first_with: dict[tuple[int, ...], str] = {}
    for i, (run, lengths) in enumerate(series):
        counts = np.bincount(lengths, minlength=top + 1)[1:]
        same_as = first_with.setdefault(tuple(counts), label(run))
        # The pooled mean leads (docs/use/benchmarks.md, "Acceptance"): the median of whole numbers hides the tail.
        mean = float(np.mean(lengths))
        text = f"{label(run)} (mean {mean:.2f}, median {np.median(lengths):g}, {lengths.size} steps)"
        if same_as != label(run):
            text += f" — identical to {same_as}"
        bars = ax.bar(
            values + (i - (len(series) - 1) / 2) * width,
            counts / lengths.size,
            width=width,
            alpha=0.8,
            hatch=HATCHES[i % len(HATCHES)],
            edgecolor="black",
            linewidth=0.5,
            label=text,
        )
        ax.axvline(
            mean,
            linestyle=LINESTYLES[i % len(LINESTYLES)],
            linewidth=1.2,
            color=bars.patches[0].get_facecolor(),
        )
    if not series:
        ax.text(0.5, 0.5, "no acceptance lengths recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks(values)  # lengths are whole numbers: a tick for each, none between
    ax.set_xlabel("acceptance length L = accepted draft tokens + 1, per verification step")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Acceptance length (vertical lines: the mean over steps)")
    if series:
        ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return fig


def acceptance_histogram(runs: Sequence[Run]) -> bytes | None:
    fig = draw_acceptance(runs)
    return None if fig is None else _png(fig)


def draw_timeline(run: Run) -> Figure:
    """Record index vs request throughput, with the cumulative request time: drift, warm-up and stalls show here."""
    fig = Figure(figsize=(7.0, 3.8))
    ax = fig.add_subplot()
    index = np.arange(len(run.records))
    tok_s = [r["request_tok_s"] for r in run.records]
    ax.plot(index, tok_s, "o-", markersize=3, linewidth=0.8, label="request tok/s")
    ax.set_xlabel("record index (in the order written)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # records are counted: no tick between two
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
    return fig


def timeline(run: Run) -> bytes:
    return _png(draw_timeline(run))


# --- ratios on a log scale ------------------------------------------------------------------------------------
# A latency ratio is positive and multiplicative (×2 slower mirrors ×0.5 faster), so its axis is logarithmic and a
# band drawn on it is an interval of ratios, never `1 ± w` read linearly (which, for a wide A/A band, ran below 0).


def noise_interval(noise: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """The A/A noise band as an interval of latency ratios: the measured interval of the base run against itself,
    else (one prompt, no interval) `1 ± w` taken multiplicatively, [1 / (1 + w), 1 + w]; always above 0."""
    if not noise or noise.get("half_width") is None:
        return None
    ci = noise.get("ci")
    if ci and ci.get("low") and ci.get("high") and ci["low"] > 0:
        return float(min(ci["low"], 1.0)), float(max(ci["high"], 1.0))
    w = float(noise["half_width"])
    return 1.0 / (1.0 + w), 1.0 + w


def admission_limit(doc: Mapping[str, Any]) -> float:
    """The latency ratio a comparison's whole interval must lie below to be admitted (`stats.admission`):
    1 − the threshold, or 1 − the A/A noise band where that is wider; 0 or less means nothing can be."""
    noise = doc.get("noise_band") or {}
    return 1.0 - max(doc["threshold"], noise.get("half_width") or 0.0)


def _plain_number(value: float, _pos: object = None) -> str:
    return f"{value:.3g}"


def log_ratio_axis(axis: Any, low: float, high: float) -> None:
    """Plain numbers (0.5, 1, 2) on a log axis from `low` to `high`: 1–2–5 steps over a wide range, evenly spaced
    values over a narrow one (where a decade's ticks would leave the axis bare)."""
    if high / low > 4:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    else:
        axis.set_major_locator(MaxNLocator(nbins=6))
    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(NullFormatter())


def _log_limits(values: Sequence[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    pad = max(1.02, (high / low) ** 0.06)
    return low / pad, high * pad


def draw_comparison(doc: Mapping[str, Any]) -> Figure:
    """Per-prompt latency ratios with their median, its interval, the admission limit and the A/A noise band, on
    a log axis (right: the same as a speedup)."""
    rows = sorted(doc["per_prompt"], key=lambda r: r["ratio"])
    fig = Figure(figsize=(max(6.5, 0.5 * len(rows) + 3.0), 4.4))
    ax = fig.add_subplot()
    ax.set_yscale("log")
    x = np.arange(len(rows))
    shown = [1.0, *(r["ratio"] for r in rows if r["ratio"] > 0)]
    noise = noise_interval(doc.get("noise_band"))
    if noise:
        w = doc["noise_band"]["half_width"]
        ax.axhspan(  # hatched, not filled: the interval of the median (filled) often lies on top of it
            *noise,
            facecolor="none",
            edgecolor="grey",
            hatch="///",
            linewidth=0,
            label=f"A/A noise of the base run [{noise[0]:.3g}, {noise[1]:.3g}] (±{w:.0%})",
        )
        shown += noise
    ax.axhline(1.0, color="black", linewidth=0.8)
    limit = admission_limit(doc)
    if limit > 0:
        ax.axhline(limit, color="tab:red", linestyle="--", label=f"admitted only below {limit:.4g}")
        shown.append(limit)
    else:
        ax.text(
            0.01,
            0.02,
            f"no speedup can be admitted: the rule asks for a latency ratio below 1 − "
            f"{doc['noise_band']['half_width']:.0%} (the A/A noise), which is below 0",
            transform=ax.transAxes,
            fontsize=8,
            color="tab:red",
        )
    ax.plot(x, [r["ratio"] for r in rows], "o", label="per-prompt ratio")
    if doc.get("ci"):
        ax.axhspan(
            doc["ci"]["low"],
            doc["ci"]["high"],
            color="tab:blue",
            alpha=0.15,
            label=f"{doc['confidence']:.0%} interval of the median",
        )
        shown += [doc["ci"]["low"], doc["ci"]["high"]]
    if doc.get("median_ratio"):
        ax.axhline(
            doc["median_ratio"], color="tab:blue", linewidth=1.2, label=f"median {doc['median_ratio']:.4f}"
        )
    low, high = _log_limits(shown)
    ax.set_ylim(low, high)
    log_ratio_axis(ax.yaxis, low, high)
    speedup = ax.secondary_yaxis("right", functions=(_inverse, _inverse))
    log_ratio_axis(speedup.yaxis, 1 / high, 1 / low)
    speedup.set_ylabel("speedup, base / candidate (×)")
    ax.set_xticks(x, [r["prompt_id"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("request latency, candidate / base\n(log scale; below 1: candidate faster)")
    verdict = doc["verdict"]["decision"].replace("_", " ")
    ax.set_title(f"{doc['candidate']['run_id']} vs {doc['base']['run_id']}: {verdict}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0))  # outside: the points stay in view
    ax.grid(axis="y", alpha=0.3)
    return fig


def comparison_figure(doc: Mapping[str, Any]) -> bytes:
    return _png(draw_comparison(doc))


def _inverse(values: Any) -> Any:
    with np.errstate(divide="ignore"):
        return 1.0 / np.asarray(values, dtype=float)


def draw_speedup(docs: Sequence[Mapping[str, Any]]) -> Figure:
    """Is it faster? Each comparison's speedup with its interval, over the grey band its base run's A/A noise spans
    (a speedup inside it is indistinguishable from the run against itself), on a log axis."""
    fig = Figure(figsize=(7.5, 1.2 + 0.7 * len(docs)))
    ax = fig.add_subplot()
    ax.set_xscale("log")
    shown = [1.0]
    for i, doc in enumerate(docs):
        y = len(docs) - 1 - i  # the first comparison on top, as listed
        noise = noise_interval(doc.get("noise_band"))
        if noise:
            band = (1 / noise[1], 1 / noise[0])
            ax.fill_betweenx(
                [y - 0.35, y + 0.35],
                *band,
                color="grey",
                alpha=0.25,
                linewidth=0,
                label="A/A noise of the base run" if i == 0 else None,
            )
            shown += band
        limit = admission_limit(doc)
        if limit > 0:
            ax.plot(
                [1 / limit] * 2,
                [y - 0.35, y + 0.35],
                color="tab:red",
                linestyle="--",
                label="admitted only right of this" if i == 0 else None,
            )
            shown.append(1 / limit)
        ratio = doc.get("median_ratio")
        if not ratio:
            continue
        ci = doc.get("ci")
        err = None
        if ci and ci.get("low") and ci.get("high"):
            err = [[1 / ratio - 1 / ci["high"]], [1 / ci["low"] - 1 / ratio]]
            shown += [1 / ci["high"], 1 / ci["low"]]
        shown.append(1 / ratio)
        ax.errorbar(
            [1 / ratio],
            [y],
            xerr=err,
            fmt="o",
            color="tab:blue",
            capsize=4,
            label=f"speedup, {doc['confidence']:.0%} interval" if i == 0 else None,
        )
        verdict = doc["verdict"]["decision"].replace("_", " ")
        if limit <= 0:
            verdict += f"\n(A/A noise ±{doc['noise_band']['half_width']:.0%}:\nnothing admissible)"
        ax.text(
            1.02,
            y,
            f"{1 / ratio:.3f}×\n{verdict}",
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=8,
        )
    ax.axvline(1.0, color="black", linewidth=0.8)
    low, high = _log_limits(shown)
    ax.set_xlim(low, high)
    log_ratio_axis(ax.xaxis, low, high)
    ax.set_yticks(
        range(len(docs)),
        [f"{d['candidate']['run_id']}\nvs {d['base']['run_id']}" for d in reversed(docs)],
        fontsize=8,
    )
    ax.set_ylim(-0.7, len(docs) - 0.3)
    ax.set_xlabel("speedup = base / candidate request latency (log scale; right of 1: candidate faster)")
    ax.set_title("Is it faster?")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=3, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def speedup_figure(docs: Sequence[Mapping[str, Any]]) -> bytes:
    return _png(draw_speedup(docs))
