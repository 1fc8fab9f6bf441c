"""A pipeline stage's live progress, read from what it writes while it runs: the stage's own probe of its log where
it has one (`Stage.progress`: train reads speculators' epochs, steps and loss), else the rows it appends (regen,
pretokenize: `rows.jsonl`, and regen's `errors.jsonl`) against the rows it reads, where both are JSON-lines files,
and otherwise the last line of its log (a server starting). Only outputs written since the stage started count: a
rerun's old rows are not its progress (regen, resuming, appends to its file and counts once it has). Rendered by
`core.progress.Watch`."""

from __future__ import annotations

import time
from pathlib import Path

from draftscope.core.progress import Reading, count_lines, last_line
from draftscope.pipeline.plan import StagePlan

ROW_OUTPUTS = ("rows", "errors")  # the files a row-by-row stage appends to, one line per input row
ROW_INPUTS = ("rows", "chat")


def _jsonl(path: Path) -> bool:
    return path.suffix == ".jsonl"


class StageProbe:
    """The stage's own probe; else rows done of the rows read (a row-by-row stage), with the log's last line; else
    that line alone."""

    def __init__(self, sp: StagePlan, log: Path) -> None:
        self.log = log
        make = getattr(getattr(sp, "stage", None), "progress", None)
        self.own = make(log) if make is not None else None
        self.outputs = [a.path for a in sp.outputs if a.name in ROW_OUTPUTS and _jsonl(a.path)]
        self.unit = getattr(self.own, "unit", "") if self.own else ("rows" if self.outputs else "")
        sources = [a.path for a in sp.inputs if a.name in ROW_INPUTS and _jsonl(a.path)]
        self.total = count_lines(sources[0]) if self.outputs and sources else None
        self.since = time.time()  # an output not written since is a previous run's (a rerun with --force)

    def _written(self, path: Path) -> bool:
        try:
            return path.stat().st_mtime >= self.since
        except OSError:
            return False

    def __call__(self) -> Reading:
        if self.own is not None:
            return self.own()
        note = last_line(self.log)
        if not self.outputs:
            return Reading(note=note)
        counts = [count_lines(p) for p in self.outputs if self._written(p)]
        done = sum(c for c in counts if c is not None)
        return Reading(done, self.total, note=note)
