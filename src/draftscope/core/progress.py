"""Live progress of a step that runs elsewhere (a subprocess, a container), read from the files it writes.

A `Watch` polls a probe (about once a second) while the step runs and renders what it reads: on a terminal a rich
progress bar (done / total, a rate, the time left); otherwise (CI, a pipe, the demo) a plain line each time the
count moves and at least every `every` seconds, so that a log stays readable and never goes silent. The probe reads
files another process is writing: a half-written line is left for the next poll, and a probe that fails is skipped
for that poll — the watch never stops the step it watches. `stop()` ends it (on completion, failure or Ctrl-C) with
one last reading.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

Printer = Callable[[str], None]
TAIL_PREFIX = "  | "


@dataclass(frozen=True)
class Reading:
    """What a probe saw: `done` of `total` units (None: not known), a rate already worded, a free note, the
    seconds left when the probe knows better than the elapsed time does (loading excluded, say), and what each unit
    done since the last reading was."""

    done: int | None = None
    total: int | None = None
    rate: str = ""
    note: str = ""
    eta: float | None = None
    events: tuple[str, ...] = ()  # one per unit done since the last reading (the last is `note`): a line each


Probe = Callable[[], Reading]


def complete_lines(path: Path, start: int = 0) -> tuple[list[str], int]:
    """The whole lines of a file another process appends to, from byte `start`, and the offset after the last
    one: a line still being written (no newline yet) is left for the next read. No file yet: nothing."""
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read()
    except OSError:
        return [], start
    end = data.rfind(b"\n") + 1
    if end == 0:
        return [], start
    text = data[:end].decode("utf-8", errors="replace")
    return text.splitlines(), start + end


def count_lines(path: Path) -> int | None:
    """Complete lines in a file (None when it does not exist yet)."""
    try:
        with path.open("rb") as handle:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))
    except OSError:
        return None


def tail_text(path: Path | None, size: int = 8192) -> str:
    """The last `size` bytes of a file, as text ('' when it cannot be read)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def last_line(path: Path | None, width: int = 100, text: str | None = None) -> str:
    """The last non-empty line of a log (or of its `text` already read), cut to `width` characters."""
    data = tail_text(path) if text is None else text
    lines = [line.strip() for line in data.replace("\r", "\n").splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= width else line[: width - 1] + "…"


def tail_lines(path: Path | None, lines: int = 20) -> list[str]:
    """The last `lines` lines of a log, as lines (never joined into one)."""
    if path is None:
        return []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.rstrip("\n").splitlines()[-lines:]


def print_tail(path: Path | None, say: Printer, lines: int = 20) -> None:
    """A failed step's log tail, one printed line per log line, each prefixed alike."""
    found = tail_lines(path, lines)
    if not found:
        return
    say(f"last {len(found)} lines of {path}:")
    for line in found:
        say(TAIL_PREFIX + line)


def _clock(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


class Watch:
    """Follows one step through its probe until `stop()`; see the module's docstring."""

    def __init__(
        self,
        label: str,
        probe: Probe,
        *,
        say: Printer = print,
        unit: str = "",
        interval: float = 1.0,
        every: float = 5.0,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.probe, self.say, self.unit = label, probe, say, unit
        self.interval, self.every, self.clock = interval, every, clock
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.last = Reading()
        self._started = self._said = clock()
        self._said_done: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"watch {label}", daemon=True)
        self._bar = None
        self._task = None

    def start(self) -> Watch:
        self._started = self._said = self.clock()
        if self.tty:
            self._open_bar()
        self._poll()  # a first reading at once: the total, the phase
        self._thread.start()
        return self

    def stop(self) -> None:
        """The last reading, then the bar closed (or a last plain line). Safe to call twice, or before start."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._poll(final=True)
        if self._bar is not None:
            with contextlib.suppress(Exception):
                self._bar.stop()

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- polling ----------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def _poll(self, final: bool = False) -> None:
        try:
            reading = self.probe()
        except Exception:  # a file mid-rename, a JSON line mid-write, anything: the next poll tries again
            return
        self.last = reading
        try:
            if self._bar is not None:
                self._update_bar(reading)
            else:
                self._plain(reading, final)
        except Exception:  # a closed stdout must not take the step down with it
            return

    def line(self, reading: Reading) -> str:
        elapsed = self.clock() - self._started
        parts = [self.label + ":"]
        if reading.done is not None:
            of = f"/{reading.total}" if reading.total is not None else ""
            parts.append(f"{reading.done}{of} {self.unit}".rstrip())
        if reading.rate:
            parts.append(reading.rate)
        parts.append(f"{_clock(elapsed)} elapsed")
        eta = self.eta(reading, elapsed)
        if eta is not None:
            parts.append(f"ETA {_clock(eta)}")
        text = ", ".join(parts[1:])
        return f"{parts[0]} {text}" + (f" — {reading.note}" if reading.note else "")

    @staticmethod
    def eta(reading: Reading, elapsed: float) -> float | None:
        if not reading.done or reading.total is None or reading.done >= reading.total:
            return None
        if reading.eta is not None:
            return reading.eta
        return elapsed / reading.done * (reading.total - reading.done)

    def _plain(self, reading: Reading, final: bool) -> None:
        now = self.clock()
        moved = reading.done is not None and reading.done != self._said_done
        if final and reading.done is not None and not moved:
            return  # the last line already said it
        if final or moved or now - self._said >= self.every:
            if moved and reading.done is not None:  # the units that landed within one poll, a line each
                of = f"/{reading.total}" if reading.total is not None else ""
                first = reading.done - len(reading.events) + 1
                for i, event in enumerate(reading.events[:-1]):
                    self.say(f"{self.label}: {first + i}{of} {self.unit} — {event}")
            self.say(self.line(reading))
            self._said, self._said_done = now, reading.done

    # --- the terminal's bar -----------------------------------------------------------------------------------

    def _open_bar(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            TextColumn("{task.fields[note]}"),
            transient=False,
        )
        self._task = self._bar.add_task(self.label, total=None, rate="", eta="", note="")
        self._bar.start()

    def _update_bar(self, reading: Reading) -> None:
        assert self._bar is not None
        eta = self.eta(reading, self.clock() - self._started)
        self._bar.update(
            self._task,
            completed=reading.done or 0,
            total=reading.total,
            rate=reading.rate,
            eta=f"ETA {_clock(eta)}" if eta is not None else "",
            note=reading.note[:60],
        )


@contextlib.contextmanager
def watching(label: str, probe: Probe, **options: object) -> Iterator[Watch]:
    """A `Watch` for the duration of a block: stopped however the block ends (Ctrl-C included)."""
    watch = Watch(label, probe, **options)  # type: ignore[arg-type]
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()
