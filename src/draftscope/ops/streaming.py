"""A command run with its output both kept in a log and shown as it comes, for the demo: every line the command
prints is written to the log and printed with a prefix; when it prints nothing for `every` seconds, a line says it
is still running, so a terminal (or CI's log) never goes silent."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

Printer = Callable[[str], None]
PREFIX = "    "


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    try:
        for raw in iter(stream.readline, b""):
            lines.put(raw)
    finally:
        lines.put(None)


def run_streamed(
    argv: list[str],
    log: Path,
    *,
    say: Printer,
    label: str,
    env: Mapping[str, str] | None = None,
    every: float = 6.0,  # the benchmark's and the stages' own lines come every 5 s: no quiet line between
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run `argv`, appending its output to `log` and echoing each line; its exit code. Ctrl-C stops the command
    (the KeyboardInterrupt goes on once it has ended)."""
    started = clock()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        assert proc.stdout is not None
        lines: queue.Queue[bytes | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            while True:
                try:
                    raw = lines.get(timeout=every)
                except queue.Empty:
                    say(f"{PREFIX}… {label}: still running ({clock() - started:.0f} s)")
                    continue
                if raw is None:
                    break
                out.write(raw)
                out.flush()
                say(PREFIX + raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            return proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
