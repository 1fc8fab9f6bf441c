"""The acceptance ledger: one set of named acceptance figures, the same definitions for every backend.

A verification step proposes d drafted tokens (d = k, the draft tokens per step, unless the engine drafted fewer)
and emits L = a + 1 tokens: the a drafts it accepted (a prefix of the proposal) and one bonus or correction token.
A prefill that verifies nothing (vLLM, SGLang) is not a step; the kit's own loop verifies its first proposal in
the prefill call, so there every generated token is in a step. Over a run with requests r = 1..R, step j of
request r emitting L_rj, E_r = Σ_j L_rj tokens in N_r steps, A_r = Σ_j (L_rj − 1) accepted and P_r = Σ_j d_rj
proposed drafts:

- mean_pooled          = Σ_r E_r / Σ_r N_r                      (pooled over steps; vLLM's and SGLang's servers)
- mean_per_request     = (1/R) Σ_r (E_r / N_r)                   (mean of per-request means; SpecForge)
- mean_token_weighted  = Σ_r E_r · (E_r / N_r) / Σ_r E_r          (per-request means weighted by their tokens)
- rate                 = Σ_r A_r / Σ_r P_r                       (accepted drafts / proposed drafts)
- per_position[i − 1]  = #{steps with a ≥ i} / #{steps with d ≥ i}, i = 1..k   (P(draft position i accepted))

With a constant k, rate = (mean_pooled − 1) / k and Σ_i per_position[i − 1] = k · rate. Sources, each giving
(E_r, N_r, A_r, P_r) per request: the records' `acceptance_lengths` (the kit's loop; vLLM's per-request metrics at
the detailed level), vLLM's per-request totals in `extra` and its spec-decode counters' delta, SGLang's
`meta_info` counts. Where two sources exist they are cross-checked and a disagreement is recorded, never hidden.
Pure and dependency-free: a partial run (records missing fields) is summarised the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VLLM_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
TOLERANCE = 1e-9  # two figures computed from the same counts agree exactly, up to float rounding


@dataclass(frozen=True)
class Request:
    """One request's counts: emitted tokens in its verification steps, steps, accepted and proposed drafts."""

    emitted: int
    steps: int
    accepted: int
    proposed: int | None  # None where the drafts per step are not known
    positions: tuple[tuple[int, int], ...] | None = None  # (steps with a ≥ i, steps with d ≥ i), i = 1..k


def from_lengths(lengths: Sequence[int], k: int | None, drafted: Sequence[int] | None = None) -> Request:
    """A request from its per-step lengths L_j (accepted drafts + 1); `drafted` per step where it differs from k."""
    if drafted is None or len(drafted) != len(lengths):
        drafted = [k] * len(lengths) if k else None
    positions = None
    if drafted is not None:
        top = max(drafted, default=0)
        positions = tuple(
            (sum(1 for n in lengths if n - 1 >= i), sum(1 for d in drafted if d >= i))
            for i in range(1, top + 1)
        )
    return Request(
        emitted=sum(lengths),
        steps=len(lengths),
        accepted=sum(n - 1 for n in lengths),
        proposed=sum(drafted) if drafted is not None else None,
        positions=positions,
    )


def ledger(requests: Sequence[Request], source: str) -> dict[str, Any] | None:
    """The named figures over `requests` (those with at least one step); None when none has a step."""
    rows = [r for r in requests if r.steps > 0]
    if not rows:
        return None
    emitted = sum(r.emitted for r in rows)
    steps = sum(r.steps for r in rows)
    accepted = sum(r.accepted for r in rows)
    proposed = sum(r.proposed for r in rows) if all(r.proposed is not None for r in rows) else None
    means = [r.emitted / r.steps for r in rows]
    per_position = None
    if all(r.positions is not None for r in rows):
        width = max(len(r.positions or ()) for r in rows)
        hits = [sum(r.positions[i][0] for r in rows if i < len(r.positions)) for i in range(width)]
        tries = [sum(r.positions[i][1] for r in rows if i < len(r.positions)) for i in range(width)]
        per_position = [h / t if t else None for h, t in zip(hits, tries, strict=True)] or None
    return {
        "source": source,
        "requests": len(rows),
        "steps": steps,
        "emitted_tokens": emitted,
        "accepted_drafts": accepted,
        "proposed_drafts": proposed,
        "mean_pooled": emitted / steps,
        "mean_per_request": sum(means) / len(means),
        "mean_token_weighted": sum(r.emitted * m for r, m in zip(rows, means, strict=True)) / emitted
        if emitted
        else None,
        "rate": accepted / proposed if proposed else None,
        "per_position": per_position,
        "cross_checks": [],
    }


def cross_check(
    name: str, primary: Mapping[str, Any], other: Mapping[str, Any] | None, note: str = ""
) -> dict:
    """`other`'s counts against the ledger's: steps, accepted and proposed drafts, and the figures they give."""
    keys = ("steps", "accepted_drafts", "proposed_drafts", "mean_pooled", "rate")
    if other is None:
        return {"source": name, "available": False, "agrees": None, "differences": [], "note": note}
    differences = []
    for key in keys:
        mine, theirs = primary.get(key), other.get(key)
        if mine is None or theirs is None:
            continue
        if abs(float(mine) - float(theirs)) > TOLERANCE * max(1.0, abs(float(mine))):
            differences.append({"field": key, "ledger": mine, "source": theirs})
    return {
        "source": name,
        "available": True,
        "agrees": not differences,
        "differences": differences,
        **{key: other.get(key) for key in keys},
        "note": note,
    }


# --- the benchmark records (the kit's loop; vLLM) -------------------------------------------------------------


def _vllm_totals(record: Mapping[str, Any]) -> Request | None:
    extra = record.get("extra") or {}
    steps, accepted = extra.get("verification_steps"), extra.get("accepted_tokens_total")
    if not isinstance(steps, int) or not isinstance(accepted, int):
        return None
    proposed = extra.get("draft_tokens_total")
    return Request(accepted + steps, steps, accepted, proposed if isinstance(proposed, int) else None)


def _vllm_counters(record: Mapping[str, Any]) -> Request | None:
    delta = (record.get("extra") or {}).get("spec_decode_counters")
    if not isinstance(delta, Mapping) or not all(isinstance(delta.get(n), int) for n in VLLM_COUNTERS):
        return None
    steps, proposed, accepted = (delta[n] for n in VLLM_COUNTERS)
    return Request(accepted + steps, steps, accepted, proposed)


def from_records(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ledger of a benchmark run's records; None when no record says anything about acceptance.

    Primary source: each record's `acceptance_lengths` (with `draft_tokens_per_step`, and vLLM's
    `extra.draft_tokens_by_step` where it drafted fewer). A vLLM record without per-step lengths falls back to its
    per-request totals. vLLM's per-request totals and its counters' delta, where records carry them, are
    cross-checked against the per-step figures over the same records.
    """
    records = list(records)
    steps_rows, totals_rows, counter_rows, fallback = [], [], [], []
    for record in records:
        lengths = record.get("acceptance_lengths")
        totals, counters = _vllm_totals(record), _vllm_counters(record)
        if lengths:
            drafted = (record.get("extra") or {}).get("draft_tokens_by_step")
            steps_rows.append(from_lengths(lengths, record.get("draft_tokens_per_step"), drafted))
            totals_rows.append(totals)
            counter_rows.append(counters)
        elif totals is not None:
            fallback.append(totals)
    if steps_rows:
        out = ledger(steps_rows, "acceptance_lengths (per verification step)")
        if out is None:
            return None
        if fallback:
            out["cross_checks"].append(
                {
                    "source": "records without per-step lengths",
                    "available": False,
                    "agrees": None,
                    "differences": [],
                    "note": f"{len(fallback)} record(s) carry only vLLM's per-request totals and are left out",
                }
            )
        for name, rows in (
            ("vllm per-request spec-decode metrics (totals)", totals_rows),
            ("vllm spec-decode counters (delta per request)", counter_rows),
        ):
            if any(r is not None for r in rows):
                complete = all(r is not None for r in rows)
                other = ledger([r for r in rows if r is not None], name) if complete else None
                note = "" if complete else "not every record carries it; not compared"
                out["cross_checks"].append(cross_check(name, out, other, note))
        return out
    if fallback:
        return ledger(fallback, "vllm per-request spec-decode metrics (totals; no per-step lengths)")
    return None


# --- SGLang's per-request meta_info (bench stage rows) --------------------------------------------------------


def from_sglang(rows: Iterable[Mapping[str, Any]], drafted_per_step: int | None) -> dict[str, Any] | None:
    """The ledger of SGLang's per-request rows (`completion_tokens`, `spec_verify_ct`, and where reported
    `spec_num_correct_drafts`, `spec_num_proposed_drafts`, `spec_accept_length`).

    SGLang's first output token comes from the prefill, which verifies nothing, so a request's steps emit
    completion_tokens − 1 tokens; its own spec_accept_length = completion_tokens / spec_verify_ct counts that token
    too (1 / spec_verify_ct higher than the ledger's per-request mean). The accepted drafts are SGLang's
    spec_num_correct_drafts where reported (cross-checked against completion_tokens − 1 − spec_verify_ct), else that
    difference. SGLang records no per-step counts, so there is no per-position figure.
    """
    rows = [r for r in rows if isinstance(r.get("spec_verify_ct"), int) and r["spec_verify_ct"] > 0]
    if not rows:
        return None
    requests, derived, reported = [], [], []
    for r in rows:
        steps, completion = r["spec_verify_ct"], r["completion_tokens"]
        by_tokens = completion - 1 - steps
        correct = r.get("spec_num_correct_drafts")
        accepted = correct if isinstance(correct, int) else by_tokens
        proposed = r.get("spec_num_proposed_drafts")
        if not isinstance(proposed, int):
            proposed = steps * drafted_per_step if drafted_per_step else None
        requests.append(Request(accepted + steps, steps, accepted, proposed))
        derived.append(Request(by_tokens + steps, steps, by_tokens, proposed))
        if isinstance(r.get("spec_accept_length"), int | float):
            reported.append((float(r["spec_accept_length"]), completion / steps))
    out = ledger(requests, "sglang meta_info (spec_verify_ct, spec_num_correct_drafts, completion_tokens)")
    if out is None:
        return None
    if any(isinstance(r.get("spec_num_correct_drafts"), int) for r in rows):
        out["cross_checks"].append(
            cross_check(
                "sglang completion_tokens − 1 − spec_verify_ct",
                out,
                ledger(derived, "tokens"),
                "accepted drafts from the token count (the prefill token taken out)",
            )
        )
    if reported:
        mismatched = [(a, b) for a, b in reported if abs(a - b) > 1e-6 * max(1.0, b)]
        out["cross_checks"].append(
            {
                "source": "sglang spec_accept_length (completion_tokens / spec_verify_ct per request)",
                "available": True,
                "agrees": not mismatched,
                "differences": [
                    {"field": "spec_accept_length", "ledger": b, "source": a} for a, b in mismatched
                ],
                "mean_per_request": sum(a for a, _ in reported) / len(reported),
                "note": "SGLang's own figure counts the prefill token: 1 / spec_verify_ct above the ledger's "
                "per-request mean",
            }
        )
    return out
