"""The figures of comparisons (PNG bytes, matplotlib Agg, like `figures`): each comparison's per-prompt latency
ratios, and every comparison's speedup in one figure (the report's "Is it faster?").

A latency ratio is positive and multiplicative (×2 slower mirrors ×0.5 faster), so its axis is logarithmic and a
band drawn on it is an interval of ratios, never `1 ± w` read linearly (which, for a wide A/A band, ran below 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from draftscope.analysis.figures import png


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
    return png(draw_comparison(doc))


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
    return png(draw_speedup(docs))
