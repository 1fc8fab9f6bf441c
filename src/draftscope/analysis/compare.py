"""BASE vs CANDIDATE: join per prompt on the prompt hash, paired latency ratios, bootstrap interval, verdict,
A/A noise band, greedy token check → a schema-valid comparison document (and a figure).

Runs are immutable once completed, so the comparison is written outside both: `--output FILE`, or
`comparisons/<base>__<candidate>.json` under the current directory, created exclusively.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftscope.analysis import stats, verdict
from draftscope.analysis.load import Run
from draftscope.analysis.output import refuse_existing, write_new
from draftscope.core import schema as schemas
from draftscope.core.errors import UserError
from draftscope.core.jsonio import dumps
from draftscope.core.provenance import command_line, kit_info, now
from draftscope.core.summary import first_divergence, stat

CONFIDENCE = 0.95
TRUNCATED = ("length", "fixed_tokens")  # a sequence cut by a limit is a prefix of a longer one


def default_output(base: Run, candidate: Run) -> Path:
    return Path("comparisons") / f"{base.run_id}__{candidate.run_id}.json"


def refuse_unfinished(runs: Sequence[Run], *, allowed: bool) -> None:
    """A run that did not complete (running, failed, timed out, interrupted) covers only the prompts it reached, in
    conditions that may have changed as it ended: comparing it is refused unless asked for (`--allow-unfinished`),
    and then the comparison names it partial."""
    if allowed:
        return
    for run in runs:
        if run.status != "completed":
            reason = run.manifest.get("reason")
            raise UserError(
                f"run {run.run_id} is unfinished (status '{run.status}'"
                + (f": {reason}" if reason else "")
                + "); its figures cover only the records it wrote",
                source=str(run.path),
                fix="compare completed runs, or pass --allow-unfinished to compare its finished records "
                "(the comparison is marked partial)",
            )


def join(base: Run, candidate: Run, *, allow_subset: bool) -> tuple[list[str], dict[str, Any]]:
    """Prompt hashes both runs have, in the base's order; refuse differing sets unless `allow_subset`."""
    b, c = base.by_prompt, candidate.by_prompt
    missing_in_candidate = [b[k].prompt_id for k in b if k not in c]
    missing_in_base = [c[k].prompt_id for k in c if k not in b]
    if (missing_in_candidate or missing_in_base) and not allow_subset:
        parts = []
        if missing_in_candidate:
            parts.append(f"missing in the candidate {candidate.run_id}: {', '.join(missing_in_candidate)}")
        if missing_in_base:
            parts.append(f"missing in the base {base.run_id}: {', '.join(missing_in_base)}")
        raise UserError(
            "the two runs' prompt sets differ (" + "; ".join(parts) + ")",
            field="prompts",
            fix="compare runs of the same prompt file, or pass --allow-subset to compare the shared prompts",
        )
    keys = [k for k in b if k in c]
    if not keys:
        raise UserError(
            f"runs {base.run_id} and {candidate.run_id} share no prompt (joined on the prompt hash)",
            fix="compare runs made from the same prompt file",
        )
    info = {
        "joined": len(keys),
        "allow_subset": allow_subset,
        "missing_in_base": missing_in_base,
        "missing_in_candidate": missing_in_candidate,
    }
    return keys, info


def token_expectation(base: Run, candidate: Run) -> tuple[bool, str]:
    """Greedy tokens must agree when both runs decode the same target the same way; speculative drafts and the
    certified prefix head leave greedy tokens unchanged by construction, so they do not break the expectation."""
    facts = {
        "target": (base.target, candidate.target),
        "backend": (base.config.get("backend"), candidate.config.get("backend")),
        "dtype": (base.dtype, candidate.dtype),
        "device": (base.config.get("device"), candidate.config.get("device")),
    }
    differ = [f"{k} {a} vs {b}" for k, (a, b) in facts.items() if a != b]
    if differ:
        return False, "not expected to agree: " + "; ".join(differ)
    return True, (
        f"same target {base.target}, backend {facts['backend'][0]}, dtype {facts['dtype'][0]}, device "
        f"{facts['device'][0]}: greedy decoding with exact verification must give the same tokens"
    )


def divergence(a: Mapping[str, Any], b: Mapping[str, Any]) -> int | None:
    """First differing position of two greedy outputs; a length limit only shortens, never contradicts."""
    x, y = a["generated_token_ids"], b["generated_token_ids"]
    n = min(len(x), len(y))
    pos = first_divergence(x[:n], y[:n])
    if pos is None and len(x) != len(y):
        shorter = a if len(x) < len(y) else b
        if shorter["finish_reason"] not in TRUNCATED:
            pos = n  # one stopped (EOS) where the other went on
    return pos


def token_check(base: Run, candidate: Run, keys: Sequence[str], expected: bool, basis: str) -> dict[str, Any]:
    """Each candidate record against the base record of the same repeat (else the base's first repeat)."""
    compared = identical = 0
    mismatches = []
    per_prompt = []
    for key in keys:
        base_rows = base.by_prompt[key].records
        by_repeat = {r["repeat"]: r for r in base_rows}
        row = {"prompt_id": candidate.by_prompt[key].prompt_id, "compared": 0, "identical": 0}
        positions = []
        for rec in candidate.by_prompt[key].records:
            ref = by_repeat.get(rec["repeat"], base_rows[0])
            compared += 1
            row["compared"] += 1
            pos = divergence(ref, rec)
            if pos is None:
                identical += 1
                row["identical"] += 1
            else:
                positions.append(pos)
                mismatches.append(
                    {
                        "prompt_id": rec["prompt_id"],
                        "base_repeat": ref["repeat"],
                        "candidate_repeat": rec["repeat"],
                        "position": pos,
                    }
                )
        # Per prompt: how many of its records agree, and the earliest position where one diverges.
        per_prompt.append({**row, "first_divergence": min(positions) if positions else None})
    return {
        "expected_identical": expected,
        "basis": basis,
        "compared": compared,
        "identical": identical,
        "mismatches": mismatches,
        "first_mismatch": mismatches[0] if mismatches else None,
        "per_prompt": per_prompt,
    }


def within_run(base: Run, candidate: Run) -> dict[str, Any]:
    """Whether each run's repeats agree with its own first repeat (the summary's greedy agreement): a run whose
    engine changed the target's output on one repeat disagrees with itself, whatever the other run did."""

    def one(run: Run) -> dict[str, Any]:
        found = run.summary["disagreements"]
        return {"agree": not found, "disagreements": len(found), "first": found[0] if found else None}

    return {"base": one(base), "candidate": one(candidate)}


def _pair_stat(base: Run, candidate: Run, key: str) -> dict[str, Any]:
    b = stat(r[key] for r in base.records)
    c = stat(r[key] for r in candidate.records)
    ratio = c["median"] / b["median"] if b and c and b["median"] > 0 and c["median"] > 0 else None
    return {"base": b, "candidate": c, "ratio": ratio}


def compare_runs(
    base: Run,
    candidate: Run,
    *,
    threshold: float,
    resamples: int = 10_000,
    seed: int = 0,
    allow_subset: bool = False,
    study: str | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """The comparison document (kind `comparison`); `reproduce` adds its own block and kind."""
    if resamples < 1:
        raise UserError("resamples must be at least 1", field="--resamples", value=resamples)
    keys, prompt_info = join(base, candidate, allow_subset=allow_subset)
    paired = stats.paired_ratios(base.by_prompt, candidate.by_prompt, keys)
    ci = stats.bootstrap_median_ci(paired.ratios, resamples=resamples, seed=seed, confidence=CONFIDENCE)
    noise = stats.noise_band(
        {k: base.by_prompt[k] for k in keys},
        base.repeats,
        resamples=resamples,
        seed=seed,
        confidence=CONFIDENCE,
    )
    expected, basis = token_expectation(base, candidate)
    notes = [
        f"{run.run_id} is partial ({run.status}); only its finished records are used"
        for run in (base, candidate)
        if run.partial
    ]
    if noise is None:
        notes.append("no A/A noise band: the base run has fewer than two repeats")
    elif noise["half_width"] is not None and noise["half_width"] > threshold:
        notes.append(
            f"the A/A noise band (±{noise['half_width']:.2%}) is wider than the threshold ({threshold:.2%}): "
            "this setup cannot resolve an effect of that size"
        )
    return {
        "schema_version": 1,
        "kind": "comparison",
        "created_at": now(),
        "kit": kit_info(),
        "command_line": command_line(argv),
        "study": study,
        "base": base.describe(),
        "candidate": candidate.describe(),
        "metric": "request_seconds",
        "threshold": threshold,
        "confidence": CONFIDENCE,
        "resamples": resamples,
        "seed": seed,
        "prompts": prompt_info,
        "per_prompt": list(paired.rows),
        "median_ratio": paired.median,
        "ci": ci.to_dict() if ci else None,
        "verdict": stats.admission(ci, threshold, CONFIDENCE, noise),
        "noise_band": noise,
        "throughput": {
            "request_tok_s": _pair_stat(base, candidate, "request_tok_s"),
            "decode_tok_s": _pair_stat(base, candidate, "decode_tok_s"),
        },
        "tokens": {
            **token_check(base, candidate, keys, expected, basis),
            "within_run": within_run(base, candidate),
        },
        "figure": None,
        "reproduction": None,
        "notes": notes,
    }


def write_comparison(doc: dict[str, Any], path: Path, *, figure: bool = True, flag: str = "--output") -> Path:
    """Validate, then create `path` (and `<stem>.png` beside it) exclusively; returns the JSON path."""
    # lazy: matplotlib, for the figure; the JSON alone (and `analyze`) needs none
    from draftscope.analysis.comparison_figures import comparison_figure

    path = Path(path)
    png = path.with_suffix(".png")
    refuse_existing(path, flag)
    if figure:
        refuse_existing(png, flag)
        doc["figure"] = png.name
    schemas.check(doc, "comparison", str(path))
    if figure:
        write_new(png, comparison_figure(doc), flag)
    write_new(path, dumps(doc).encode("utf-8"), flag)
    return path


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """What `invoke compare` prints: the verdict first, then the numbers behind it."""
    ci = doc["ci"]
    decision = doc["verdict"]["decision"].upper().replace("_", " ")
    pair = f"{doc['candidate']['run_id']} vs {doc['base']['run_id']}"
    if doc["kind"] == "reproduction":
        same = "identical" if doc["reproduction"]["tokens_identical"] else "DIFFER"
        lines = [
            f"REPRODUCTION {pair}: token ids {same}",
            f"  timing, reported and not judged: {decision.lower()} at {doc['threshold']:.2%}; "
            + doc["verdict"]["reason"],
        ]
    else:
        lines = [
            f"{decision}: {pair} at a {doc['threshold']:.2%} threshold",
            f"  in short: {verdict.sentence(doc)}",
            f"  {doc['verdict']['reason']}",
        ]
    lines.append(
        f"  median latency ratio (candidate/base) {doc['median_ratio']:.4f}"
        + (f", {doc['confidence']:.0%} CI [{ci['low']:.4f}, {ci['high']:.4f}]" if ci else ", no interval")
        + f" over {doc['prompts']['joined']} prompts ({doc['resamples']} resamples, seed {doc['seed']})"
    )
    noise = doc["noise_band"]
    if noise:
        nci = noise["ci"]
        lines.append(
            f"  A/A noise band in the base run: ratio {noise['median_ratio']:.4f}"
            + (f", CI [{nci['low']:.4f}, {nci['high']:.4f}]" if nci else "")
            + f", ±{noise['half_width']:.2%} (repeats {noise['halves'][0]} vs {noise['halves'][1]})"
        )
    t = doc["throughput"]["request_tok_s"]
    if t["base"] and t["candidate"]:
        # Not the speed measure (the paired latency ratio above is): medians over all records, unpaired, decode
        # and prefill mixed — on a noisy machine it can point the other way, so it says what it is.
        lines.append(
            f"  request tok/s, unpaired medians over all records (not the verdict's measure): base "
            f"{t['base']['median']:.1f}, candidate {t['candidate']['median']:.1f}"
            + (f" (×{t['ratio']:.3f})" if t["ratio"] else "")
        )
    tok = doc["tokens"]
    first = tok["first_mismatch"]
    if first is None:
        line = f"  greedy tokens: {tok['identical']}/{tok['compared']} identical"
    else:
        line = (
            f"  greedy tokens: {len(tok['mismatches'])} of {tok['compared']} differ; first: prompt "
            f"{first['prompt_id']} (repeat {first['candidate_repeat']}) at position {first['position']}"
        )
    if not tok["expected_identical"]:
        line += f" ({tok['basis']})"
    elif first is not None:
        line += " — a MISMATCH where tokens must agree"
    lines.append(line)
    for side, own in tok.get("within_run", {}).items():
        if not own["agree"]:
            d = own["first"]
            lines.append(
                f"  {side}'s own repeats DISAGREE: {own['disagreements']} record(s) differ from their prompt's first "
                f"repeat; first: prompt {d['prompt_id']} repeat {d['repeat']} at position "
                f"{d['first_diverging_position']} (greedy decoding must repeat itself)"
            )
    for row in tok.get("per_prompt", ()):
        where = row["first_divergence"]
        agreement = f"{row['identical']}/{row['compared']} identical"
        lines.append(
            f"    {row['prompt_id']}: {agreement}"
            + ("" if where is None else f", first divergence at position {where}")
        )
    for p in ("missing_in_base", "missing_in_candidate"):
        if doc["prompts"][p]:
            lines.append(f"  {p.replace('_', ' ')}: {', '.join(doc['prompts'][p])}")
    lines += [f"  note: {n}" for n in doc["notes"]]
    return lines
