"""Reliability figures, and `invoke reliability`: the fault-injection suite, the bad-input corpus and the
planted-secret check, run and summed up.

The suite (`tests/reliability/`, marker `reliability`) records every fault it injects, every bad input it tries
and every output it searches for planted secrets in a `Figures` tally; pytest writes the tally as JSON to the file
named by `$DRAFTSCOPE_RELIABILITY_FIGURES`. `invoke reliability` runs the suite with a seed (kill points are drawn
from it), prints the figures and fails when the suite fails or a bound is missed: at least 50 faults over the four
step kinds, every one survived, no record lost, no torn line, at least 200 bad inputs each refused cleanly, and no
secret in any output.

Bad inputs come in two kinds, counted apart: the named corpus (each case written by hand, with the phrase its error
must hold) and generated cases (hostile values drawn for every option of every command, tests/reliability/optfuzz.py).
A generated case ends refused cleanly, accepted cleanly (exit 0, nothing written outside its outputs), or broken: a
traceback, a hang, a write on refusal, an unclean refusal (no `error:` line) or a value that reached a shell. The
bounds: at least 500 generated cases over at least 20 commands, none broken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core import settings
from draftscope.core.jsonio import atomic_write_json

FIGURES_ENV = settings.DRAFTSCOPE_RELIABILITY_FIGURES.name
SEED_ENV = settings.DRAFTSCOPE_RELIABILITY_SEED.name
DEFAULT_SEED = settings.DRAFTSCOPE_RELIABILITY_SEED.default
STEP_KINDS = ("benchmark", "regen", "hsextract", "train")
MIN_FAULTS = 50
MIN_BAD_INPUTS = 200
MIN_GENERATED = 500
MIN_GENERATED_TASKS = 20
GENERATED_OK = ("refused", "accepted")
# What a generated case can end as: the two clean outcomes, then the ways to break the contract.
GENERATED_OUTCOMES = (*GENERATED_OK, "traceback", "hang", "wrote", "unclean", "canary")


def seed_from_env() -> int:
    return settings.DRAFTSCOPE_RELIABILITY_SEED.get()


@dataclass
class Fault:
    """One injected fault: where (step kind), what (signal and point), and what it cost."""

    kind: str
    what: str
    survived: bool = False
    lost: int = (
        0  # records (lines, rows, files, completed stages) finished before the fault and missing after
    )
    torn: int = 0  # lines cut short or unreadable left in a JSON Lines file

    def lose(self, n: int) -> None:
        self.lost += max(0, int(n))

    def tear(self, n: int) -> None:
        self.torn += max(0, int(n))


@dataclass
class Rerun:
    """A resume or rerun after faults: what it found lost or torn counts in the totals (it is not a fault)."""

    kind: str
    what: str
    ok: bool = False
    lost: int = 0
    torn: int = 0

    def lose(self, n: int) -> None:
        self.lost += max(0, int(n))

    def tear(self, n: int) -> None:
        self.torn += max(0, int(n))


@dataclass
class BadInput:
    name: str
    refused: bool


@dataclass
class GeneratedCase:
    """One generated bad input: the command, the option given a hostile value, and how it ended."""

    task: str
    option: str
    outcome: str  # one of GENERATED_OUTCOMES


@dataclass
class Figures:
    faults: list[Fault] = field(default_factory=list)
    reruns: list[Rerun] = field(default_factory=list)
    bad_inputs: list[BadInput] = field(default_factory=list)
    generated: list[GeneratedCase] = field(default_factory=list)
    secret_hits: int = 0
    files_searched: int = 0
    seed: int | None = None

    @contextlib.contextmanager
    def fault(self, kind: str, what: str) -> Iterator[Fault]:
        """Count a fault as injected; it survived when the block's checks all pass (no exception)."""
        item = Fault(kind, what)
        self.faults.append(item)
        yield item
        item.survived = item.lost == 0 and item.torn == 0

    @contextlib.contextmanager
    def rerun(self, kind: str, what: str) -> Iterator[Rerun]:
        """Count the resume or rerun that must complete after faults; ok when its checks all pass."""
        item = Rerun(kind, what)
        self.reruns.append(item)
        yield item
        item.ok = item.lost == 0 and item.torn == 0

    def bad_input(self, name: str, refused: bool) -> None:
        self.bad_inputs.append(BadInput(name, refused))

    def generated_case(self, task: str, option: str, outcome: str) -> None:
        if outcome not in GENERATED_OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; one of {GENERATED_OUTCOMES}")
        self.generated.append(GeneratedCase(task, option, outcome))

    def secrets(self, hits: int, files: int) -> None:
        self.secret_hits += hits
        self.files_searched += files

    # -- totals -------------------------------------------------------------------------------------------------

    @property
    def survived(self) -> int:
        return sum(f.survived for f in self.faults)

    @property
    def lost(self) -> int:
        return sum(f.lost for f in [*self.faults, *self.reruns])

    @property
    def torn(self) -> int:
        return sum(f.torn for f in [*self.faults, *self.reruns])

    @property
    def refused(self) -> int:
        return sum(b.refused for b in self.bad_inputs)

    def generated_counts(self) -> dict[str, int]:
        """How many generated cases ended each way (every outcome listed, zeros included)."""
        counts = dict.fromkeys(GENERATED_OUTCOMES, 0)
        for case in self.generated:
            counts[case.outcome] += 1
        return counts

    def by_kind(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for f in self.faults:
            n, ok = out.get(f.kind, (0, 0))
            out[f.kind] = (n + 1, ok + f.survived)
        return out

    def shortfalls(self) -> list[str]:
        """The acceptance bounds this tally misses (empty: all met)."""
        out = []
        if len(self.faults) < MIN_FAULTS:
            out.append(f"{len(self.faults)} faults injected, fewer than {MIN_FAULTS}")
        missing = [k for k in STEP_KINDS if k not in self.by_kind()]
        if missing:
            out.append(f"no fault injected into: {', '.join(missing)}")
        if self.survived != len(self.faults):
            out.append(f"{len(self.faults) - self.survived} fault(s) not survived")
        failed = [r for r in self.reruns if not r.ok]
        if failed:
            out.append(f"{len(failed)} rerun(s) after faults did not complete cleanly")
        if self.lost:
            out.append(f"{self.lost} record(s) lost")
        if self.torn:
            out.append(f"{self.torn} torn line(s)")
        if self.refused < MIN_BAD_INPUTS:
            out.append(f"{self.refused} bad inputs refused cleanly, fewer than {MIN_BAD_INPUTS}")
        if self.refused != len(self.bad_inputs):
            out.append(f"{len(self.bad_inputs) - self.refused} bad input(s) not refused cleanly")
        counts = self.generated_counts()
        if len(self.generated) < MIN_GENERATED:
            out.append(f"{len(self.generated)} generated bad inputs, fewer than {MIN_GENERATED}")
        tasks = {c.task for c in self.generated}
        if len(tasks) < MIN_GENERATED_TASKS:
            out.append(f"generated bad inputs for {len(tasks)} commands, fewer than {MIN_GENERATED_TASKS}")
        for outcome in GENERATED_OUTCOMES[len(GENERATED_OK) :]:
            if counts[outcome]:
                out.append(f"{counts[outcome]} generated bad input(s) ended: {outcome}")
        if self.secret_hits:
            out.append(f"{self.secret_hits} planted secret(s) found in outputs")
        return out

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{k} {ok}/{n}" for k, (n, ok) in sorted(self.by_kind().items()))
        return [
            f"seed: {self.seed}",
            f"faults injected / survived: {len(self.faults)} / {self.survived}  ({kinds})",
            f"resumes and reruns after faults / complete: {len(self.reruns)} / {sum(r.ok for r in self.reruns)}",
            f"bad inputs tried / refused cleanly (named corpus): {len(self.bad_inputs)} / {self.refused}",
            self.generated_line(),
            f"records lost: {self.lost}",
            f"torn lines: {self.torn}",
            f"secrets found in outputs: {self.secret_hits} (in {self.files_searched} files searched)",
        ]

    def generated_line(self) -> str:
        n = self.generated_counts()
        tasks = len({c.task for c in self.generated})
        return (
            f"bad inputs generated (every option of {tasks} commands) tried / refused cleanly / accepted cleanly /"
            f" tracebacks / hangs / wrote on refusal: {len(self.generated)} / {n['refused']} / {n['accepted']} /"
            f" {n['traceback']} / {n['hang']} / {n['wrote']}"
            + "".join(f"; {k}: {n[k]}" for k in ("unclean", "canary") if n[k])
        )

    # -- persistence (pytest writes, the task reads) -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figures:
        return cls(
            faults=[Fault(**f) for f in data.get("faults", [])],
            reruns=[Rerun(**r) for r in data.get("reruns", [])],
            bad_inputs=[BadInput(**b) for b in data.get("bad_inputs", [])],
            generated=[GeneratedCase(**g) for g in data.get("generated", [])],
            secret_hits=int(data.get("secret_hits", 0)),
            files_searched=int(data.get("files_searched", 0)),
            seed=data.get("seed"),
        )

    def write(self, path: Path) -> None:
        atomic_write_json(Path(path), self.to_dict())

    @classmethod
    def merged(cls, parts: list[Figures]) -> Figures:
        """One tally from several (pytest-xdist workers each keep their own): every list joined, the counts summed.
        The parts must share one seed: a run's kill points are drawn from it."""
        seeds = {p.seed for p in parts}
        if len(seeds) > 1:
            raise ValueError(f"tallies of different seeds cannot be merged: {sorted(map(str, seeds))}")
        out = cls(seed=next(iter(seeds), None))
        for part in parts:
            out.faults += part.faults
            out.reruns += part.reruns
            out.bad_inputs += part.bad_inputs
            out.generated += part.generated
            out.secret_hits += part.secret_hits
            out.files_searched += part.files_searched
        return out
