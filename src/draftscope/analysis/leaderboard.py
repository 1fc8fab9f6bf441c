"""Latency percentiles from the records, and a leaderboard: runs ranked by one chosen metric.

Both read the records as they are (no summary figure), with the definitions of `vllm bench serve`
(`analysis/timing.py`): TTFT is a record's first token timestamp (seconds since its request started, so prefill and
backend overhead are in it); inter-token latency (ITL) is the gap between successive token arrivals, tokens with the
same timestamp (a speculative step's) counting as one arrival, pooled over every record of the run. Percentiles are
NumPy's (linear interpolation), p50 / p90 / p99; a run without per-token timestamps has none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from draftscope.analysis.load import Run
from draftscope.core.errors import UserError

QUANTILES = (50, 90, 99)


def ttft_ms(run: Run) -> list[float]:
    """Per record with timestamps: the first token's time since the request started, in ms."""
    from draftscope.analysis import timing  # lazy: numpy

    return [timing.ttft(r["token_timestamps"]) * 1e3 for r in run.records if r.get("token_timestamps")]


def itl_ms(run: Run) -> list[float]:
    """Every gap between successive token arrivals of a record, in ms, over all records."""
    from draftscope.analysis import timing  # lazy: numpy

    return [gap * 1e3 for r in run.records for gap in timing.itls(r.get("token_timestamps")) or []]


def percentile(values: Sequence[float], q: float) -> float:
    from draftscope.analysis import timing  # lazy: numpy

    return timing.percentile(values, q)  # type: ignore[return-value]


def percentile_cell(values: Sequence[float]) -> str:
    if not values:
        return "— (no per-token timestamps)"
    return " / ".join(f"{percentile(values, q):.1f}" for q in QUANTILES) + f" (n={len(values)})"


def latency_cells(run: Run) -> dict[str, str]:
    return {"ttft": percentile_cell(ttft_ms(run)), "itl": percentile_cell(itl_ms(run))}


def _median(run: Run, key: str) -> float | None:
    stat = run.summary["overall"].get(key)
    return stat["median"] if stat else None


def _acceptance(run: Run) -> float | None:
    ledger = run.summary["overall"].get("acceptance") if run.speculative else None
    return ledger["mean_pooled"] if ledger else None


def _p50(values: list[float]) -> float | None:
    return percentile(values, 50) if values else None


@dataclass(frozen=True)
class Metric:
    title: str
    value: Callable[[Run], float | None]
    higher_is_better: bool
    digits: int = 1


METRICS: dict[str, Metric] = {
    "request-tok-s": Metric("median request tok/s", lambda r: _median(r, "request_tok_s"), True),
    "decode-tok-s": Metric("median decode tok/s", lambda r: _median(r, "decode_tok_s"), True),
    "acceptance": Metric("mean acceptance length (pooled over steps)", _acceptance, True, 2),
    "ttft-p50": Metric("TTFT p50 (ms)", lambda r: _p50(ttft_ms(r)), False),
    "itl-p50": Metric("inter-token latency p50 (ms)", lambda r: _p50(itl_ms(r)), False),
}


def metric(name: str) -> Metric:
    if name not in METRICS:
        raise UserError("unknown metric", field="--sort", value=name, fix=f"one of: {', '.join(METRICS)}")
    return METRICS[name]


def ranked(runs: Sequence[Run], name: str) -> list[tuple[Run, float | None]]:
    """The runs best first by metric `name`; runs without the figure last, in the order given."""
    chosen = metric(name)
    scored = [(run, chosen.value(run)) for run in runs]
    measured = [(r, v) for r, v in scored if v is not None]
    measured.sort(key=lambda rv: rv[1], reverse=chosen.higher_is_better)  # stable: ties keep the given order
    return measured + [(r, v) for r, v in scored if v is None]


def leaderboard_rows(runs: Sequence[Run], name: str) -> list[dict[str, str]]:
    """Rank, run, the metric's value and what identifies the run, as text (terminal, report.md, report.html)."""
    chosen = metric(name)
    rows = []
    for rank, (run, value) in enumerate(ranked(runs, name), start=1):
        rows.append(
            {
                "rank": str(rank) if value is not None else "—",
                "run": run.run_id,
                "value": f"{value:.{chosen.digits}f}" if value is not None else "— (not measured)",
                "backend": run.backend,
                "target": run.target,
                "draft": run.draft or "—",
                "status": run.status_label,
            }
        )
    return rows


LEADERBOARD_COLUMNS = (
    ("rank", "rank"),
    ("run", "run"),
    ("value", "value"),
    ("backend", "backend"),
    ("model@revision", "target"),
    ("draft", "draft"),
    ("status", "status"),
)


def leaderboard_table(runs: Sequence[Run], name: str) -> Table:
    chosen = metric(name)
    order = "higher is better" if chosen.higher_is_better else "lower is better"
    table = Table(title=f"Leaderboard: {chosen.title} ({order})", title_justify="left")
    for title, _ in LEADERBOARD_COLUMNS:
        table.add_column(chosen.title if title == "value" else title, overflow="fold")
    for row in leaderboard_rows(runs, name):
        table.add_row(*(row[key] for _, key in LEADERBOARD_COLUMNS))
    return table
