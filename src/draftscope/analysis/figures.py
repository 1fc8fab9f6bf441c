"""The report's figures as PNG bytes (matplotlib, Agg; no pyplot, so no global state and no display needed).

Each function takes loaded runs and returns PNG bytes, or None when the figure has nothing
to show (e.g. the acceptance-length histogram without a speculative run); its `draw_*` twin returns the Figure
itself, whose axes the tests read. Partial runs are drawn like the others, labelled partial. Counts get whole-number
ticks, and series that may coincide a hatching, line style or marker each. A comparison's figures (ratios, on a log
axis) are in `comparison_figures`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from draftscope.analysis.load import Run

DPI = 100
# Series of different runs are told apart by more than colour: a hatching, a line style, a marker each.
HATCHES = ("", "//", "\\\\", "xx", "..", "++")
LINESTYLES = ("--", ":", "-.", (0, (5, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P")


def png(fig: Figure) -> bytes:
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
    return png(fig)


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
    return png(fig)


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
    return None if fig is None else png(fig)


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
    return png(draw_timeline(run))
