"""A benchmark's live progress, read from its run directory while the worker writes it: the records appended to
`records.jsonl` (prompts done, tok/s, the latest request) and, before the first one, the worker's phase from
`worker.json` (loading the model, warming up). Rendered by `core.progress.Watch`: a bar on a terminal, plain lines
elsewhere. The Slurm executor's submitting side follows a run in its job the same way."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftscope.core.progress import Printer, Reading, Watch, complete_lines

PHASES = {
    "loading": "loading the model",
    "loaded": "warming up",
    "measuring": "measuring",
    "done": "done",
}


class RecordsProbe:
    """Reads the records appended since the last call (a line cut short is left for the next one)."""

    def __init__(self, path: Path, total: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.total, self.clock = path, total, clock
        self.done = 0
        self.tokens = 0
        self.seconds = 0.0
        self.measuring_since: float | None = None  # when the first request began, by this clock
        self.latest = ""
        self._offset = 0

    def __call__(self) -> Reading:
        lines, self._offset = complete_lines(self.path, self._offset)
        events = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # not a record (a torn write is repaired by the supervisor, not counted here)
            if isinstance(record, dict):
                self._add(record)
                events.append(self.latest)
        rate = f"{self.tokens / self.seconds:.1f} tok/s" if self.seconds > 0 else ""
        # The time left at the pace of the requests so far, measured from the start of the first (the model's
        # loading and warm-up are behind it): what a request costs end to end, its record's writing included.
        eta = None
        if self.measuring_since is not None and self.done:
            eta = (self.clock() - self.measuring_since) / self.done * (self.total - self.done)
        return Reading(self.done, self.total, rate, self.latest or self._phase(), eta, tuple(events))

    def _add(self, r: dict[str, Any]) -> None:
        self.done += 1
        tokens, seconds = r.get("generated_tokens"), r.get("request_seconds")
        if isinstance(tokens, int) and isinstance(seconds, (int, float)) and seconds > 0:
            self.tokens += tokens
            self.seconds += seconds
        if self.measuring_since is None:
            self.measuring_since = self.clock() - (seconds if isinstance(seconds, (int, float)) else 0.0)
        acc = r.get("acceptance_lengths")
        per_step = f", {sum(acc) / len(acc):.2f} tokens/step" if isinstance(acc, list) and acc else ""
        tok_s = r.get("request_tok_s")
        speed = f", {tok_s:.1f} tok/s" if isinstance(tok_s, (int, float)) else ""
        decode = r.get("decode_tok_s")
        speed += f", decode {decode:.1f} tok/s" if isinstance(decode, (int, float)) and decode else ""
        self.latest = f"{r.get('prompt_id')} repeat {r.get('repeat')}: {tokens} tokens{speed}{per_step}"

    def _phase(self) -> str:
        try:
            phase = json.loads((self.path.parent / "worker.json").read_text(encoding="utf-8")).get("phase")
        except (OSError, ValueError, AttributeError):
            return "starting the worker"
        return PHASES.get(phase, str(phase))


class Progress:
    """Follows a benchmark's records while its worker runs: `start()`, then `stop()` however the step ended."""

    def __init__(
        self,
        path: Path,
        total: int,
        say: Printer,
        interval: float = 1.0,
        every: float = 5.0,
        tty: bool | None = None,
    ) -> None:
        self.probe = RecordsProbe(path, total)
        self.watch = Watch(
            "benchmark", self.probe, say=say, unit="requests", interval=interval, every=every, tty=tty
        )
        self._started = False

    def start(self) -> None:
        self._started = True
        self.watch.start()

    def stop(self) -> None:
        if self._started:
            self.watch.stop()
