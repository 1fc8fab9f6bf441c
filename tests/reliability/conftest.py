"""The reliability tier: faults injected into real runs, the bad-input corpus, planted secrets.

Every test records what it injected or tried in one session-wide `Figures` tally (`draftscope.ops.reliability`); at
the end of the session the tally is printed and, when `$DRAFTSCOPE_RELIABILITY_FIGURES` names a file, written
there for `invoke reliability`. Kill points are drawn from `$DRAFTSCOPE_RELIABILITY_SEED` (printed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from draftscope.ops.reliability import FIGURES_ENV, Figures, seed_from_env

FIGURES = Figures(seed=seed_from_env())


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


@pytest.fixture(scope="session")
def seed() -> int:
    return FIGURES.seed  # type: ignore[return-value]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(FIGURES_ENV)
    if target and (
        FIGURES.faults or FIGURES.reruns or FIGURES.bad_inputs or FIGURES.generated or FIGURES.files_searched
    ):
        FIGURES.write(Path(target))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if FIGURES.faults or FIGURES.reruns or FIGURES.bad_inputs or FIGURES.generated or FIGURES.files_searched:
        terminalreporter.section("reliability figures")
        for line in FIGURES.lines():
            terminalreporter.write_line(line)
