"""The train stage's live progress, read from speculators' log: the epoch n/N, the step, the training loss, the last
validation loss, and — once an epoch has ended — the steps in all (steps per epoch × epochs, or `--max-steps` when
fewer), from which the rate and the time left.

Why facts and never a raw line: speculators logs through rich, wrapped to the terminal's width, so one metrics
record spans many lines and a long path breaks mid-word; the log's last line is often a fragment of one
(`ipeline/checkpoints/14`). The log is read on from where the last poll stopped (whole lines only, from the size it
had when the stage started), so no epoch's line is missed however fast the steps come.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from draftscope.core.progress import Reading, complete_lines

# speculators 0.9.0 (speculators/train/trainer.py): `root_logger.info(f"Training epoch {e}/{n} started")` and the
# metrics record of each logged step, `{"train": {"loss": …}, …, "global_step": N}` flattened to `train/loss=…`.
EPOCH_STARTED = re.compile(r"\bTraining epoch (\d+)/(\d+) started")
EPOCH_DONE = re.compile(r"\bTraining epoch (\d+)/(\d+) completed")
VALIDATING = re.compile(r"\bValidation epoch (\d+)/(\d+) started")
VALIDATED = re.compile(r"\bValidation epoch (\d+)/(\d+) completed")
SAVING = re.compile(r"\bSaving checkpoint\b")
STEP = re.compile(r"\bglobal_step=(\d+)")
NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
LOSS = re.compile(r"\btrain/loss=" + NUMBER)
VAL_LOSS = re.compile(r"\bval/loss_epoch=" + NUMBER)
MAX_STEPS = re.compile(r"\btrainer/max_steps=(\d+)")  # the run's arguments, logged first


class TrainProgress:
    """A probe (`core.progress.Watch`) of one train log; keeps what it has read between polls."""

    unit = "steps"

    def __init__(self, log: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.clock = log, clock
        # The runtime appends to the log: what a previous run wrote is not this one's progress.
        self.offset = log.stat().st_size if log.is_file() else 0
        self.epoch: tuple[int, int] | None = None
        self.steps: int | None = None  # steps done: the last logged global_step (0-based) + 1
        self.loss: float | None = None
        self.val_loss: tuple[int, float] | None = None
        self.per_epoch: int | None = None
        self.max_steps: int | None = None
        self.phase = "loading the model and data"
        self.first: tuple[float, int] | None = (
            None  # (time, steps) when steps were first seen: the rate's origin
        )

    def feed(self, line: str) -> None:
        """One log line: whatever of the facts above it holds."""
        if m := MAX_STEPS.search(line):
            self.max_steps = int(m.group(1))
        if m := EPOCH_STARTED.search(line):
            self.epoch = (int(m.group(1)), int(m.group(2)))
            self.phase = "training"
        if m := EPOCH_DONE.search(line):
            done = int(m.group(1))
            self.epoch = (done, int(m.group(2)))
            if self.steps and self.per_epoch is None:
                self.per_epoch = max(1, round(self.steps / done))
        if m := VALIDATING.search(line):
            self.phase = "validating"
        if m := VALIDATED.search(line):
            self.phase = "finished" if m.group(1) == m.group(2) else "training"
        if SAVING.search(line):
            self.phase = "saving a checkpoint"
        if m := STEP.search(line):
            self.steps = int(m.group(1)) + 1
            self.phase = "training"
            if self.first is None:
                self.first = (self.clock(), self.steps)
        if m := LOSS.search(line):
            self.loss = float(m.group(1))
        if (m := VAL_LOSS.search(line)) and self.epoch:
            self.val_loss = (self.epoch[0], float(m.group(1)))

    @property
    def total(self) -> int | None:
        totals = [t for t in (self.max_steps,) if t]
        if self.per_epoch and self.epoch:
            totals.append(self.per_epoch * self.epoch[1])
        return min(totals) if totals else None

    def rate(self) -> float | None:
        """Steps per second since steps were first seen (the loading before them does not count)."""
        if self.first is None or self.steps is None or self.steps <= self.first[1]:
            return None
        seconds = self.clock() - self.first[0]
        return (self.steps - self.first[1]) / seconds if seconds > 0 else None

    def note(self) -> str:
        parts = []
        if self.epoch:
            parts.append(f"epoch {self.epoch[0]}/{self.epoch[1]}")
        if self.phase != "training" or not self.epoch:
            parts.append(self.phase)
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.val_loss:
            parts.append(f"val loss {self.val_loss[1]:.3f} (epoch {self.val_loss[0]})")
        if self.steps and self.epoch and self.total is None:  # steps per epoch are counted, not announced
            parts.append(f"ETA once epoch {self.epoch[0]} ends")
        return ", ".join(parts)

    def __call__(self) -> Reading:
        lines, self.offset = complete_lines(self.log, self.offset)
        for line in lines:
            self.feed(line)
        total, rate = self.total, self.rate()
        eta = None
        if total is not None and self.steps is not None and rate:
            eta = max(0, total - self.steps) / rate
        return Reading(
            self.steps,
            total,
            rate=f"{rate:.1f} steps/s" if rate else "",
            note=self.note(),
            eta=eta,
        )
