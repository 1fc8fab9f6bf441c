"""Paired statistics: per-prompt latency ratios, their median with a seeded bootstrap interval, the admission rule.

Why paired ratios: prompts differ in length and difficulty far more than two configurations differ in speed, so each
prompt is its own control — candidate / base per prompt, then the median over prompts (robust to one odd prompt).
Why the percentile bootstrap: the median of a handful of ratios has a lumpy sampling distribution, and BCa's
jackknife acceleration is unstable (often undefined) for it; the percentile interval is the plain, stable choice.
"""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftscope.analysis.load import PromptRows
from draftscope.core.errors import UserError

CI_METHOD = "percentile bootstrap of the median over prompts"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "method": CI_METHOD}

    def half_width_around_one(self) -> float:
        return max(abs(1.0 - self.low), abs(1.0 - self.high))


def bootstrap_median_ci(
    values: Sequence[float], *, resamples: int, seed: int, confidence: float = 0.95
) -> Interval | None:
    """A seeded percentile-bootstrap interval of the median; None with fewer than two values (no spread to use)."""
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    if np.all(data == data[0]):  # every resample has the same median; scipy would warn about degenerate data
        return Interval(float(data[0]), float(data[0]))
    from scipy import stats as sps  # imported here: `analyze` needs no scipy, and it is slow to import

    rng = np.random.default_rng(seed)
    # scipy >= 1.15 calls the generator `rng`; older releases call it `random_state`.
    key = "rng" if "rng" in inspect.signature(sps.bootstrap).parameters else "random_state"
    result = sps.bootstrap(
        (data,),
        np.median,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        **{key: rng},
    )
    ci = result.confidence_interval
    return Interval(float(ci.low), float(ci.high))


@dataclass(frozen=True)
class PairedRatios:
    """Per joined prompt: (prompt hash, prompt id, base median seconds, candidate median seconds, n, n, ratio)."""

    rows: tuple[dict[str, Any], ...]

    @property
    def ratios(self) -> list[float]:
        return [r["ratio"] for r in self.rows]

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.rows else None


def paired_ratios(
    base: Mapping[str, PromptRows],
    candidate: Mapping[str, PromptRows],
    keys: Sequence[str],
    *,
    base_repeats: Sequence[int] | None = None,
    candidate_repeats: Sequence[int] | None = None,
) -> PairedRatios:
    """candidate / base of the median request seconds over repeats, for each prompt hash in `keys`."""
    rows = []
    for key in keys:
        b, c = base[key], candidate[key]
        b_sec, c_sec = b.seconds(base_repeats), c.seconds(candidate_repeats)
        if not b_sec or not c_sec:
            continue
        b_med, c_med = statistics.median(b_sec), statistics.median(c_sec)
        rows.append(
            {
                "prompt_id": c.prompt_id,
                "prompt_sha256": key,
                "base_seconds": b_med,
                "candidate_seconds": c_med,
                "base_n": len(b_sec),
                "candidate_n": len(c_sec),
                "ratio": c_med / b_med,
            }
        )
    return PairedRatios(tuple(rows))


def split_halves(repeats: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """Earlier half vs later half of the repeats: an A/A that also sees drift over the run, as two runs would."""
    ordered = sorted(set(repeats))
    if len(ordered) < 2:
        return None
    middle = len(ordered) // 2
    return ordered[:middle], ordered[middle:]


def noise_band(
    base: Mapping[str, PromptRows], repeats: Sequence[int], *, resamples: int, seed: int, confidence: float
) -> dict[str, Any] | None:
    """The A/A comparison inside one run: later half / earlier half of its repeats, paired per prompt."""
    halves = split_halves(repeats)
    if halves is None:
        return None
    first, second = halves
    paired = paired_ratios(base, base, list(base), base_repeats=first, candidate_repeats=second)
    if not paired.rows:
        return None
    ci = bootstrap_median_ci(paired.ratios, resamples=resamples, seed=seed, confidence=confidence)
    width = ci.half_width_around_one() if ci else abs(1.0 - paired.median)
    return {
        "method": "A/A inside the base run: median over prompts of (later half / earlier half of its repeats)",
        "halves": [first, second],
        "prompts": len(paired.rows),
        "median_ratio": paired.median,
        "ci": ci.to_dict() if ci else None,
        "half_width": width,
    }


def admission(
    ci: Interval | None, threshold: float, confidence: float, noise: Mapping[str, Any] | None
) -> dict[str, str]:
    """Admitted only if the whole interval lies below 1 − threshold (the candidate is faster by more than the
    threshold) and, when an A/A noise band was measured, also below 1 − that band: a gain inside the noise a
    configuration shows against itself is not a gain."""
    limit = 1.0 - threshold
    level = f"{confidence:.0%}"
    if ci is None:
        return {
            "decision": "not_admitted",
            "reason": "fewer than two prompts were joined: no interval, so nothing clears the threshold",
        }
    where = f"the {level} interval [{ci.low:.4f}, {ci.high:.4f}] of the median latency ratio"
    if ci.high >= limit:
        return {
            "decision": "not_admitted",
            "reason": f"{where} does not lie wholly below {limit:.4f} "
            f"(the candidate must be faster by more than {threshold:.2%})",
        }
    band = noise.get("half_width") if noise else None
    if band is not None and ci.high >= 1.0 - band:
        return {
            "decision": "not_admitted",
            "reason": f"{where} clears the {threshold:.2%} threshold but not the A/A noise band "
            f"(±{band:.2%}) measured in the base run",
        }
    return {
        "decision": "admitted",
        "reason": f"{where} lies wholly below {limit:.4f}: the candidate is faster by more than {threshold:.2%}",
    }


def parse_threshold(text: str | float) -> float:
    """'1%' → 0.01; a bare number below 1 is a fraction (0.01); anything else is refused, naming the fix."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UserError("expected a percentage or a fraction", field="--threshold", value=text) from None
    if not raw.endswith("%") and value >= 1:
        raise UserError(
            "a bare threshold is a fraction and must be below 1",
            field="--threshold",
            value=text,
            fix=f"write {raw}% for a percentage",
        )
    if not 0 <= value < 1:
        raise UserError("the threshold must lie in [0%, 100%)", field="--threshold", value=text)
    return value
