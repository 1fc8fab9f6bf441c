"""`invoke analyze`: the terminal table (rich) and the report folder.

The report folder is created exclusively and holds report.md, a self-contained report.html (figures embedded as
base64 PNG, no external resources) and the PNG figures themselves.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from rich.table import Table

from draftscope.analysis import comparison_figures, figures
from draftscope.analysis.comparisons import SPEED_MEASURE, Shown
from draftscope.analysis.leaderboard import LEADERBOARD_COLUMNS, latency_cells, leaderboard_rows, metric
from draftscope.analysis.load import Run
from draftscope.analysis.output import make_new_dir, write_new
from draftscope.core.provenance import kit_info, now

TEMPLATES = Path(__file__).resolve().parent / "templates"
FIELDS = (
    ("status", "status"),
    ("backend", "backend"),
    ("model@revision", "target"),
    ("draft", "draft"),
    ("images", "images"),
    ("hardware", "hardware"),
    ("prompts", "prompts"),
    ("records", "records"),
    ("request tok/s", "request_tok_s"),
    ("decode tok/s", "decode_tok_s"),
    ("TTFT ms p50 / p90 / p99", "ttft"),
    ("inter-token latency ms p50 / p90 / p99", "itl"),
    ("acceptance length (mean over steps)", "acceptance_mean"),
    ("acceptance rate (accepted / proposed drafts)", "acceptance_rate"),
    ("acceptance per draft position", "acceptance_positions"),
    ("acceptance length per request / token-weighted", "acceptance_other_means"),
    ("acceptance length (median of steps, min–max)", "acceptance_length"),
    ("acceptance cross-checks", "acceptance_checks"),
    ("greedy agreement", "greedy_agreement"),
)


def fmt_stat(s: Mapping[str, Any] | None, digits: int = 1) -> str:
    """'median (min–max)', or '—' when nothing was measured."""
    if not s:
        return "—"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def acceptance_cells(run: Run) -> dict[str, str]:
    """The acceptance ledger's figures (core/acceptance.py) as text; '—' where the run has no such figure."""
    ledger = run.summary["overall"].get("acceptance") if run.speculative else None
    if not ledger:
        none = "— (not speculative)" if not run.speculative else "—"
        keys = ("acceptance_mean", "acceptance_rate", "acceptance_positions", "acceptance_other_means")
        return {**dict.fromkeys(keys, none), "acceptance_checks": "—"}
    rate = ledger["rate"]
    positions = ledger["per_position"]
    checks = ledger["cross_checks"]
    failing = [c for c in checks if c["agrees"] is False]
    if failing:
        check = "; ".join(
            f"DISAGREE with {c['source']}: "
            + ", ".join(f"{d['field']} {d['ledger']:.4g} vs {d['source']:.4g}" for d in c["differences"])
            for c in failing
        )
    else:
        agreeing = [c["source"] for c in checks if c["agrees"]]
        check = ("agree: " + "; ".join(agreeing)) if agreeing else "— (one source)"
    return {
        "acceptance_mean": f"{ledger['mean_pooled']:.2f} ({ledger['emitted_tokens']} tokens / {ledger['steps']} steps)",
        "acceptance_rate": f"{rate:.3f} ({ledger['accepted_drafts']} / {ledger['proposed_drafts']})"
        if rate is not None
        else "— (drafts per step unknown)",
        "acceptance_positions": " ".join(
            f"{i}: {p:.2f}" if p is not None else f"{i}: —" for i, p in enumerate(positions, 1)
        )
        if positions
        else "— (no per-step counts)",
        "acceptance_other_means": f"{ledger['mean_per_request']:.2f} / "
        + (f"{ledger['mean_token_weighted']:.2f}" if ledger["mean_token_weighted"] is not None else "—"),
        "acceptance_checks": check,
    }


def run_row(run: Run) -> dict[str, str]:
    """One run's cells, as text: the same values go to the terminal, report.md and report.html."""
    s = run.summary
    overall = s["overall"]
    if s["greedy_agreement"]:
        agreement = "yes" if run.records else "— (no records)"
    else:
        d = s["disagreements"][0]
        agreement = (
            f"no: {len(s['disagreements'])} disagreement(s); first {d['prompt_id']} repeat {d['repeat']} "
            f"at position {d['first_diverging_position']}"
        )
    sha = run.prompts_sha256
    return {
        "run": run.run_id,
        "status": run.status_label,
        "backend": run.backend,
        "target": run.target,
        "draft": run.draft or "—",
        "images": run.images_label,
        "hardware": run.hardware_label,
        "prompts": f"sha256 {sha[:12]}… ({s['prompts_completed']}/{s['prompts_total']} done)" if sha else "—",
        "records": f"{len(run.records)} ({len(run.repeats)} repeat(s))",
        "request_tok_s": fmt_stat(overall.get("request_tok_s")),
        "decode_tok_s": fmt_stat(overall.get("decode_tok_s")),
        "acceptance_length": fmt_stat(overall.get("acceptance_length"), 2)
        if run.speculative
        else "— (not speculative)",
        "greedy_agreement": agreement,
        **acceptance_cells(run),
        **latency_cells(run),
    }


def runs_table(runs: Sequence[Run]) -> Table:
    """Fields down, runs across: a run's many facts stay readable in a terminal."""
    table = Table(
        title="Runs (medians with min–max over every record)", title_justify="left", show_lines=False
    )
    table.add_column("field", style="bold", no_wrap=True)
    rows = [run_row(r) for r in runs]
    for row in rows:
        table.add_column(row["run"], overflow="fold")
    for title, key in FIELDS:
        table.add_row(title, *(row[key] for row in rows))
    return table


COMPARISON_FIELDS = (
    ("speedup", "speedup"),
    ("interval", "interval"),
    ("verdict", "verdict"),
    ("threshold", "threshold"),
    ("A/A noise band", "noise_band"),
    ("latency ratio", "latency_ratio"),
    ("prompts", "prompts"),
)


def comparisons_table(shown: Sequence[Shown]) -> Table:
    """Is it faster? One column per comparison, the speedup first."""
    table = Table(title=f"Comparisons ({SPEED_MEASURE})", title_justify="left")
    table.add_column("field", style="bold", no_wrap=True)
    cells = [c.cells() for c in shown]
    for c in cells:
        table.add_column(c["pair"], overflow="fold")
    for title, key in (*COMPARISON_FIELDS, ("reason", "reason")):
        table.add_row(title, *(c[key] for c in cells))
    return table


@dataclass(frozen=True)
class FigureFile:
    name: str
    title: str
    png: bytes

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def make_figures(runs: Sequence[Run]) -> list[FigureFile]:
    out = [
        FigureFile(
            "throughput-by-prompt.png", "Per-prompt throughput by run", figures.throughput_by_prompt(runs)
        ),
        FigureFile("token-latency-cdf.png", "Per-token latency (CDF)", figures.token_latency_cdf(runs)),
    ]
    hist = figures.acceptance_histogram(runs)
    if hist is not None:
        out.append(FigureFile("acceptance-length.png", "Acceptance length (speculative runs)", hist))
    seen: set[str] = set()
    for run in runs:
        name = f"timeline-{_safe(run.run_id)}.png"
        while name in seen:  # two runs with the same id (from different folders)
            name = name.replace(".png", "-1.png")
        seen.add(name)
        out.append(FigureFile(name, f"Timeline of {run.run_id}", figures.timeline(run)))
    return out


def make_comparison_figures(shown: Sequence[Shown]) -> list[FigureFile]:
    """The speedup of every comparison in one figure (it answers "Is it faster?"), then each comparison's
    per-prompt ratios; none without comparisons."""
    if not shown:
        return []
    out = [
        FigureFile(
            "speedup.png",
            "Is it faster? Speedup with its interval",
            comparison_figures.speedup_figure([c.doc for c in shown]),
        )
    ]
    seen: set[str] = set()
    for c in shown:
        name = f"comparison-{_safe(c.path.stem)}.png"
        while name in seen:
            name = name.replace(".png", "-1.png")
        seen.add(name)
        out.append(
            FigureFile(
                name, f"Per-prompt latency ratios: {c.title}", comparison_figures.comparison_figure(c.doc)
            )
        )
    return out


def per_prompt_table(runs: Sequence[Run]) -> tuple[list[str], list[list[str]]]:
    """Rows: prompts (joined on the hash); columns: median request tok/s of each run ('—' where missing)."""
    order: dict[str, str] = {}
    for run in runs:
        for sha, rows in run.by_prompt.items():
            order.setdefault(sha, rows.prompt_id)
    header = ["prompt", *(r.run_id for r in runs)]
    body = []
    for sha, pid in order.items():
        cells = [pid]
        for run in runs:
            stats = (
                run.summary["per_prompt"].get(run.by_prompt[sha].prompt_id) if sha in run.by_prompt else None
            )
            cells.append(fmt_stat(stats["request_tok_s"]) if stats else "—")
        body.append(cells)
    return header, body


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(enabled_extensions=("html",), default_for_string=False),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["md"] = lambda value: str(value).replace("|", "\\|")  # a pipe would end a Markdown cell
    return env


def write_report(
    runs: Sequence[Run], folder: Path, comparisons: Sequence[Shown] = (), sort: str | None = None
) -> list[Path]:
    """Create `folder` (it must not exist) with report.md, report.html and the PNG figures; returns the files.
    The comparisons of these runs (`analysis.comparisons.find_comparisons`) lead the report when there are any;
    with `sort` (a metric of `analysis.leaderboard`), a leaderboard of the runs comes first under Runs."""
    # Before creating anything: a plotting failure leaves no half-made folder.
    speed = make_comparison_figures(comparisons)
    figs = [*speed[1:], *make_figures(runs)]
    folder = make_new_dir(Path(folder), "--report")
    rows = [run_row(r) for r in runs]
    header, body = per_prompt_table(runs)
    context = {
        "generated_at": now(),
        "kit": kit_info(),
        "fields": FIELDS,
        "rows": rows,
        "runs": runs,
        "figures": figs,
        "speed_figure": speed[0] if speed else None,
        "prompt_header": header,
        "prompt_rows": body,
        "partial": [r.run_id for r in runs if r.partial],
        "comparisons": [c.cells() for c in comparisons],
        "comparison_fields": COMPARISON_FIELDS,
        "speed_measure": SPEED_MEASURE,
        "leaderboard": leaderboard_rows(runs, sort) if sort else [],
        "leaderboard_title": metric(sort).title if sort else "",
        "leaderboard_columns": LEADERBOARD_COLUMNS,
    }
    env = _environment()
    written = []
    for fig in speed[:1] + figs:
        write_new(folder / fig.name, fig.png, "--report")
        written.append(folder / fig.name)
    for name in ("report.md", "report.html"):
        text = env.get_template(f"{name}.j2").render(**context)
        write_new(folder / name, text.encode("utf-8"), "--report")
        written.append(folder / name)
    return written
