"""A pipeline stage's live progress, read from what it writes while it runs: the rows it appends (regen,
pretokenize: `rows.jsonl`, and regen's `errors.jsonl`) against the rows it reads, where both are JSON-lines files,
and otherwise the last line of its log (a server starting; a trainer's `global_step=N`, counted as steps). Only
outputs written since the stage started count: a rerun's old rows are not its progress (regen, resuming, appends
to its file and counts once it has). Rendered by `core.progress.Watch`."""

from __future__ import annotations

import re
import time
from pathlib import Path

from draftscope.core.progress import Reading, count_lines, last_line, tail_text
from draftscope.pipeline.plan import StagePlan

ROW_OUTPUTS = ("rows", "errors")  # the files a row-by-row stage appends to, one line per input row
ROW_INPUTS = ("rows", "chat")


def _jsonl(path: Path) -> bool:
    return path.suffix == ".jsonl"


STEP = re.compile(r"\bglobal_step=(\d+)")
EPOCH = re.compile(r"\bepoch (\d+)/(\d+)")


class StageProbe:
    """Rows done of the rows read (a row-by-row stage), with the log's last line; else that line alone."""

    def __init__(self, sp: StagePlan, log: Path) -> None:
        self.log = log
        self.outputs = [a.path for a in sp.outputs if a.name in ROW_OUTPUTS and _jsonl(a.path)]
        self.unit = "rows" if self.outputs else "steps"
        self.epoch = ""
        sources = [a.path for a in sp.inputs if a.name in ROW_INPUTS and _jsonl(a.path)]
        self.total = count_lines(sources[0]) if self.outputs and sources else None
        self.since = time.time()  # an output not written since is a previous run's (a rerun with --force)

    def _written(self, path: Path) -> bool:
        try:
            return path.stat().st_mtime >= self.since
        except OSError:
            return False

    def __call__(self) -> Reading:
        text = tail_text(self.log)
        note = last_line(None, text=text)
        if not self.outputs:
            # speculators' trainer logs `global_step=N` and `Training epoch E/N started`
            # (kept between polls: an epoch's line soon leaves the log's tail, which each poll reads afresh)
            steps, epochs = STEP.findall(text), EPOCH.findall(text)
            self.epoch = f"epoch {epochs[-1][0]}/{epochs[-1][1]}" if epochs else self.epoch
            if self.epoch:
                note = f"{self.epoch}; {note}"
            return Reading(int(steps[-1]) if steps else None, note=note)
        counts = [count_lines(p) for p in self.outputs if self._written(p)]
        done = sum(c for c in counts if c is not None)
        return Reading(done, self.total, note=note)
