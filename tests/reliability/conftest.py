"""The reliability tier: faults injected into real runs, the bad-input corpus, planted secrets.

Every test records what it injected or tried in one session-wide `Figures` tally (`draftscope.ops.reliability`); at
the end of the session the tally is printed and, when `$DRAFTSCOPE_RELIABILITY_FIGURES` names a file, written
there for `invoke reliability`. Kill points are drawn from `$DRAFTSCOPE_RELIABILITY_SEED` (printed).

Under pytest-xdist each worker keeps its own tally and writes it beside that file (`FILE.gw0`, `FILE.gw1`, …); the
controller, whose session ends after its workers', merges them into the file and prints the merged figures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.ops.reliability import FIGURES_ENV, Figures, seed_from_env

FIGURES = Figures(seed=seed_from_env())
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set in an xdist worker only


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


@pytest.fixture(scope="session")
def seed() -> int:
    return FIGURES.seed  # type: ignore[return-value]


def _counted(tally: Figures) -> bool:
    return bool(tally.faults or tally.reruns or tally.bad_inputs or tally.generated or tally.files_searched)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global FIGURES
    target = os.environ.get(FIGURES_ENV)
    if not target:
        return
    if WORKER:
        FIGURES.write(Path(f"{target}.{WORKER}"))
        return
    parts = sorted(Path(target).parent.glob(Path(target).name + ".gw*"))
    if parts:  # the controller of xdist workers: their tallies, merged
        FIGURES = Figures.merged([FIGURES, *(Figures.from_dict(read_json(p, expect=dict)) for p in parts)])
    if _counted(FIGURES):
        FIGURES.write(Path(target))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not WORKER and _counted(FIGURES):
        terminalreporter.section("reliability figures")
        for line in FIGURES.lines():
            terminalreporter.write_line(line)
