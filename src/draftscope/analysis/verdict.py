"""A comparison's verdict in one plain sentence: what was measured, whether these timings can resolve it, what holds.

Why a sentence of its own: the numbers alone (a speedup of 0.993×, "not admitted", a tok/s ratio of 1.147) read as
"slower" to a newcomer, when on a noisy machine (a shared CPU, say) they mean "the timing cannot tell", and the
result that holds there is exactness — the greedy tokens equal the base's. An effect is resolved when the interval of
the median latency ratio excludes 1 and the A/A noise of the base run (the run against itself) is narrower than the
effect; otherwise the sentence says which fails (the interval includes 1×, the noise is wider than the effect) and
leads with the token check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def resolved(doc: Mapping[str, Any]) -> bool:
    """Whether the timings resolve the effect: an interval that excludes 1 and an A/A noise band narrower than
    the effect (|1 − median latency ratio|)."""
    ci, ratio = doc.get("ci"), doc.get("median_ratio")
    if not ci or not ratio:
        return False
    noise = (doc.get("noise_band") or {}).get("half_width")
    excludes_one = ci["high"] < 1.0 or ci["low"] > 1.0
    return excludes_one and (noise is None or noise < abs(1.0 - ratio))


def _tokens(doc: Mapping[str, Any]) -> str:
    tok = doc["tokens"]
    same, compared = tok["identical"], tok["compared"]
    if not tok["expected_identical"]:
        return f"greedy tokens are not expected to match ({same} of {compared} generations identical)"
    if same == compared:
        return f"greedy tokens identical to the base in {same} of {compared} generations"
    return f"greedy tokens DIFFER from the base in {compared - same} of {compared} generations, where they must agree"


def sentence(doc: Mapping[str, Any]) -> str:
    """The verdict of a comparison document (`compare.compare_runs`) as one sentence a person reads at a glance."""
    ratio = doc.get("median_ratio")
    ci = doc.get("ci")
    n = doc["prompts"].get("joined", len(doc.get("per_prompt") or ()))
    tokens = _tokens(doc)
    exact = doc["tokens"]["expected_identical"] and doc["tokens"]["identical"] == doc["tokens"]["compared"]
    if not ratio:
        return f"No request latency could be paired over the prompts; {tokens}."
    measured = f"Request latency over {n} prompts: speedup {1 / ratio:.3f}×"
    if ci:
        measured += f" ({doc['confidence']:.0%} interval {1 / ci['high']:.3f}×–{1 / ci['low']:.3f}×)"
    effect = abs(1.0 - ratio)
    noise = (doc.get("noise_band") or {}).get("half_width")
    decision = doc["verdict"]["decision"].replace("_", " ")
    threshold = f"{doc['threshold']:.2%}"
    if ci is None:
        return (
            f"{measured}, with no interval (fewer than two prompts): the timing cannot be judged; {tokens}."
        )
    if not resolved(doc):
        why = []
        if ci["low"] <= 1.0 <= ci["high"]:
            why.append("its interval includes 1× (no change)")
        if noise is not None and noise >= effect:
            why.append(
                f"the base run's own A/A noise (±{noise:.1%}) is wider than the {effect:.1%} latency difference"
            )
        holds = f"what holds is exactness: {tokens}" if exact else tokens
        return (
            f"{measured} cannot be resolved on this machine: {' and '.join(why)}, so the timing says neither "
            f"faster nor slower ({decision} at {threshold}) — {holds}."
        )
    how = f"latency {effect:.1%} {'lower' if ratio < 1 else 'higher'} (candidate {'faster' if ratio < 1 else 'slower'})"
    why = f"interval ±{max(ratio - ci['low'], ci['high'] - ratio):.1%}" + (
        f", A/A noise ±{noise:.1%}" if noise is not None else ", no A/A noise band (one repeat)"
    )
    return f"{measured} is resolved on this machine ({why}): {how}, {decision} at {threshold}; {tokens}."
