"""How a chain of stages ends, however it ran: each stage's outcome in order, up to the first that did not complete.
The local runner (each stage here, one after another) and a batch submission (each stage's jobs, followed to their
end) both stop there, so a failed stage is reported alike, and the stages after it are neither run nor claimed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
DONE = ("completed", "skipped")  # a stage that lets the next one run
# Worst first: the status of a job array (or of a stage's jobs) is the worst of its tasks'.
SEVERITY = ("failed", "timed_out", "interrupted", "completed")


@dataclass(frozen=True)
class StageOutcome:
    stage: str
    status: str  # completed | skipped | failed | timed_out | interrupted
    reason: str | None = None
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.status in DONE


def in_order(items: Iterable[T], outcome_of: Callable[[T], StageOutcome]) -> list[StageOutcome]:
    """Each item's outcome, in order, up to and including the first that did not complete."""
    outcomes: list[StageOutcome] = []
    for item in items:
        outcomes.append(outcome_of(item))
        if not outcomes[-1].done:
            break
    return outcomes


def worst(statuses: Iterable[str]) -> str:
    """The most severe of several run statuses (`completed` if there are none)."""
    present = set(statuses)
    return next((s for s in SEVERITY if s in present), "completed")
