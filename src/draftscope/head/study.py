"""`invoke head-study`: replay a run's captured verification calls through the certified head, offline.

For every captured call (hidden rows, draft tokens, the dense head's tokens) it certifies each row, applies both
fallback rules to the same call, and reports what docs/review/head.md asks for: calls, rows certified / uncertified-relevant /
uncertified-irrelevant, dense fallbacks under the row-wise rule versus the prefix rule, the row that triggered each
prefix fallback, tail margins (`Lo_c* − R_out`) and head margins, the K that would have sufficed, bf16 ties — and
the disagreements between certified tokens and the dense head's, which must be 0. Output: a schema-valid
`study.json` (schema `head-study`), a table, and PNG figures, in a new folder.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from draftscope import tiny
from draftscope.core.errors import UserError
from draftscope.core.hub import hub_cache_dir, hub_snapshot
from draftscope.core.jsonio import atomic_write_json, read_json
from draftscope.core.outputs import check_output_path
from draftscope.core.presets import load_model_preset
from draftscope.core.schema import check

SCHEMA = "head-study"


def quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {
        "min": ordered[0],
        "p10": q(0.1),
        "median": statistics.median(ordered),
        "p90": q(0.9),
        "max": ordered[-1],
        "n": len(ordered),
    }


def head_weight(run_dir: Path) -> Any:
    """The target's exact head weight for a run: the kit-built tiny target, or the pinned hub checkpoint's
    `lm_head.weight` (tied: `model.embed_tokens.weight`) read from the local hub cache."""
    manifest = read_json(run_dir / "manifest.json", expect=dict)
    config = manifest.get("config") or {}
    preset = load_model_preset(config.get("model_preset", ""))
    if preset.source == "kit" and not config.get("model"):
        return tiny.load_target().lm_head.weight.detach()
    return _hub_head_weight(config, preset)


def _hub_head_weight(config: dict[str, Any], preset: Any) -> Any:
    # lazy: safetensors, only for a hub model's head
    from safetensors import safe_open

    repo = config.get("model") or preset.hub.repo
    revision = config.get("revision") or preset.hub.revision
    snapshot = Path(hub_snapshot(str(hub_cache_dir()), repo, str(revision)))
    index = snapshot / "model.safetensors.index.json"
    weight_map = read_json(index, expect=dict)["weight_map"] if index.is_file() else None
    for key in ("lm_head.weight", "model.embed_tokens.weight"):
        file = (weight_map or {}).get(key, "model.safetensors")
        path = snapshot / file
        if path.is_file():
            with safe_open(str(path), framework="pt") as handle:
                if key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    return handle.get_tensor(key)
    raise UserError(
        f"no head weight for {repo}@{revision} in the local hub cache",
        field="model",
        fix="fetch the pinned checkpoint first (invoke benchmark does)",
    )


COUNTS = (
    "calls",
    "rows",
    "certified",
    "uncertified_relevant",
    "uncertified_irrelevant",
    "fallback_rowwise",
    "fallback_prefix",
    "ties",
    "disagreements",
)


def replay(head: Any, calls: list[dict[str, Any]], dtype: Any, k: int) -> dict[str, Any]:
    """Every captured call through `certify` with one coarse tier (`head`): counts, trigger rows, margins."""
    # lazy: torch, so the command line imports this module without it
    import torch

    from draftscope.head.certify import NO_DRAFT, certify
    from draftscope.head.policy import prefix_decision, rowwise_decision

    counts: Counter[str] = Counter()
    trigger_rows: Counter[int] = Counter()
    tail, margin, needed = [], [], []
    for call in calls:
        hidden = call["hidden"].to(dtype)
        draft = torch.cat([call["draft"], torch.tensor([NO_DRAFT])])
        cert = certify(head, hidden, draft, k=k, out_dtype=dtype)
        request = torch.zeros(hidden.shape[0], dtype=torch.long)
        prefix = prefix_decision(cert.certified, cert.tokens, draft, request, requests=1)
        rowwise = rowwise_decision(cert.certified, request, requests=1)
        certified = cert.certified
        counts["calls"] += 1
        counts["rows"] += int(hidden.shape[0])
        counts["certified"] += int(certified.sum())
        counts["uncertified_relevant"] += int((prefix.relevant & ~certified).sum())
        counts["uncertified_irrelevant"] += int((~prefix.relevant & ~certified).sum())
        counts["fallback_rowwise"] += int(rowwise.need_dense)
        counts["fallback_prefix"] += int(prefix.need_dense)
        counts["ties"] += int((cert.ties * certified).sum())
        counts["disagreements"] += int((certified & (cert.tokens != call["dense_tokens"])).sum())
        if bool(prefix.need_dense):
            trigger_rows[int(prefix.trigger[0])] += 1
        finite = cert.finite
        tail += [float(v) for v in cert.tail_margin[finite]]
        margin += [float(v) for v in cert.head_margin[finite & certified]]
        needed += [int(v) for v in cert.k_needed[finite]]
    return {
        **{name: counts[name] for name in COUNTS},
        "certified_fraction": counts["certified"] / max(1, counts["rows"]),
        "trigger_rows": {str(r): n for r, n in sorted(trigger_rows.items())},
        "tail_margin": quantiles(tail),
        "head_margin": quantiles(margin),
        "k_needed": quantiles([float(v) for v in needed]),
    }


def tier(name: str, bits: int, head: Any, replayed: dict[str, Any]) -> dict[str, Any]:
    """One coarse tier's line of the side-by-side comparison."""
    # lazy: torch (through quant4), so the command line imports this module without it
    from draftscope.head.quant4 import coarse_bytes

    keys = ("certified", "certified_fraction", "uncertified_relevant", "fallback_rowwise", "fallback_prefix")
    keys += ("disagreements", "tail_margin", "head_margin", "k_needed")
    return {
        "tier": name,
        "bits": bits,
        "group_size": head.group_size,
        "coarse_bytes": coarse_bytes(head, bits),
        "dense_bytes": head.vocab * head.hidden * head.weight.element_size(),
        **{key: replayed[key] for key in keys},
    }


def study(
    run_dir: Path,
    *,
    k: int = 64,
    group_size: int | None = None,
    int4_group_size: int | None = None,
    weight: Any = None,
) -> dict[str, Any]:
    """The INT8 tier's replay (top-level fields) and both tiers side by side (`tiers`: INT8, INT4)."""
    # lazy: torch, so the command line imports this module without it
    from draftscope.head.capture import read_capture
    from draftscope.head.exact import output_dtype
    from draftscope.head.quant import QuantizedHead
    from draftscope.head.quant4 import build_int4

    index, calls = read_capture(run_dir)
    weight = weight if weight is not None else head_weight(run_dir)
    dtype = output_dtype(index["dtype"])
    head = QuantizedHead.build(weight.to(dtype), group_size)
    try:
        head4 = build_int4(weight.to(dtype), int4_group_size)
    except ValueError as exc:
        raise UserError(
            str(exc),
            field="--int4-group-size",
            value=int4_group_size,
            fix="give a divisor of the hidden size",
        ) from None
    result = replay(head, calls, dtype, k)
    result4 = replay(head4, calls, dtype, k)
    return {
        "schema_version": 1,
        "run": str(run_dir),
        "k": k,
        "group_size": group_size or head.hidden,
        "dtype": index["dtype"],
        "vocab": head.vocab,
        "hidden_size": head.hidden,
        **result,
        "tiers": [tier("int8", 8, head, result), tier("int4", 4, head4, result4)],
    }


def table(result: dict[str, Any]) -> Any:
    out = Table(title=f"head study: {result['calls']} calls, {result['rows']} rows (K={result['k']})")
    out.add_column("measure")
    out.add_column("value", justify="right")
    calls = max(1, result["calls"])
    rows = [
        ("rows certified", f"{result['certified']} ({result['certified_fraction']:.1%})"),
        ("rows uncertified, relevant", str(result["uncertified_relevant"])),
        ("rows uncertified, irrelevant", str(result["uncertified_irrelevant"])),
        (
            "dense fallbacks, row-wise rule",
            f"{result['fallback_rowwise']} ({result['fallback_rowwise'] / calls:.1%})",
        ),
        (
            "dense fallbacks, prefix rule",
            f"{result['fallback_prefix']} ({result['fallback_prefix'] / calls:.1%})",
        ),
        (
            "prefix fallbacks by triggering row",
            ", ".join(f"row {r}: {n}" for r, n in result["trigger_rows"].items()) or "none",
        ),
        ("ties decided by the lowest index", str(result["ties"])),
        (
            "K that would have sufficed (median / max)",
            "-"
            if not result["k_needed"]
            else f"{result['k_needed']['median']:.0f} / {result['k_needed']['max']:.0f}",
        ),
        (
            "tail margin (median)",
            "-" if not result["tail_margin"] else f"{result['tail_margin']['median']:.4g}",
        ),
        ("disagreements with the dense head (must be 0)", str(result["disagreements"])),
    ]
    for name, value in rows:
        out.add_row(name, value)
    return out


def _q(stats: dict[str, float] | None, key: str, fmt: str = ".4g") -> str:
    return "-" if not stats else format(stats[key], fmt)


def tiers_table(result: dict[str, Any]) -> Any:
    """The coarse tiers side by side: bytes read, rows certified, fallbacks, K needed, margins."""
    tiers = result["tiers"]
    out = Table(title=f"coarse tiers side by side (K={result['k']}, {result['rows']} rows)")
    out.add_column("measure")
    for t in tiers:
        out.add_column(f"{t['tier'].upper()} (group {t['group_size']})", justify="right")
    lines = [
        ("coarse bytes / dense bytes", lambda t: f"{t['coarse_bytes'] / t['dense_bytes']:.3f}"),
        ("rows certified", lambda t: f"{t['certified']} ({t['certified_fraction']:.1%})"),
        ("rows uncertified, relevant", lambda t: str(t["uncertified_relevant"])),
        ("dense fallbacks, row-wise rule", lambda t: str(t["fallback_rowwise"])),
        ("dense fallbacks, prefix rule", lambda t: str(t["fallback_prefix"])),
        (
            "K needed (median / p90 / max)",
            lambda t: "/".join(_q(t["k_needed"], p, ".0f") for p in ("median", "p90", "max")),
        ),
        (
            "tail margin (p10 / median)",
            lambda t: f"{_q(t['tail_margin'], 'p10')} / {_q(t['tail_margin'], 'median')}",
        ),
        (
            "head margin (p10 / median)",
            lambda t: f"{_q(t['head_margin'], 'p10')} / {_q(t['head_margin'], 'median')}",
        ),
        ("disagreements with the dense head (must be 0)", lambda t: str(t["disagreements"])),
    ]
    for name, cell in lines:
        out.add_row(name, *(cell(t) for t in tiers))
    return out


def figures(result: dict[str, Any], calls_margins: dict[str, list[float]] | None, folder: Path) -> list[Path]:
    # lazy: matplotlib (pyplot once the Agg backend is chosen), only when the figures are drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(
        ["row-wise", "prefix"],
        [result["fallback_rowwise"], result["fallback_prefix"]],
        color=["#999", "#36c"],
    )
    ax.set_ylabel("dense fallbacks")
    ax.set_title(f"{result['calls']} verification calls")
    fig.tight_layout()
    paths.append(folder / "fallbacks.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    if result["trigger_rows"]:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar(list(result["trigger_rows"]), list(result["trigger_rows"].values()), color="#36c")
        ax.set_xlabel("row that triggered the prefix fallback")
        ax.set_ylabel("calls")
        fig.tight_layout()
        paths.append(folder / "trigger_rows.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def main(
    run: str,
    *,
    k: int,
    group_size: int | None,
    output: str | None,
    int4_group_size: int | None = None,
    show: Callable[[Any], None] = lambda *_: None,
) -> tuple[dict[str, Any], Path]:
    """Replay a run's captures; `show` is the caller's printer (the head prints nothing itself)."""
    run_dir = Path(run)
    if not (run_dir / "manifest.json").is_file():
        raise UserError("not a run directory (no manifest.json)", field="RUN", value=run)
    result = study(run_dir, k=k, group_size=group_size, int4_group_size=int4_group_size)
    check(result, SCHEMA, "head study")
    folder = Path(output) if output else Path("runs") / f"head-study-{run_dir.name}"
    check_output_path(folder, "--output")
    try:
        folder.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise UserError(
            "the output folder exists; studies are never overwritten",
            field="--output",
            value=str(folder),
            fix="choose a new path",
        ) from None
    atomic_write_json(folder / "study.json", result)
    pngs = figures(result, None, folder)
    show(table(result))
    show(tiers_table(result))
    show(f"study: {folder / 'study.json'} and {len(pngs)} figure(s)")
    return result, folder
