"""In-container entry point of the pipeline stages: `python -m draftscope.pipeline COMMAND --result FILE …`.

Each command does one stage's work in its image (or in this environment with `--runtime local`) and writes a small
result file (versions read from package metadata, counts, duration, exit code) that the host folds into the stage's
completion record. Heavy libraries are imported lazily inside the command that needs them.

- `exec STAGE -- ARGV…`: run an upstream command (speculators prepare-data, torchrun …) unchanged, forwarding
  SIGTERM/SIGINT to it, and record how it ended.
- every other command is an `Entry` a stage declares (`stages/<name>/__init__.py`), read from the registry: its
  arguments, its `main`, and whether it writes the result file (the tiny target's server, `tinyserve`, does not).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError, run_main
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.provenance import versions
from draftscope.core.schema import check
from draftscope.pipeline import registry
from draftscope.pipeline.base import NOTES

RESULT_SCHEMA_VERSION = 1
RESULT_SCHEMA = "stage-result"  # stages/<stage>.result.json


def write_result(
    path: str | None,
    stage: str,
    started: float,
    exit_code: int,
    counts: dict[str, Any],
    notes: list[str] | None = None,
) -> None:
    if not path:
        return

    save_result(
        Path(path),
        {
            "schema_version": RESULT_SCHEMA_VERSION,
            "stage": stage,
            "exit_code": exit_code,
            "seconds": round(time.monotonic() - started, 3),
            "versions": versions(),
            "counts": counts,
            "notes": notes or [],
        },
    )


def save_result(path: Path, result: dict[str, Any]) -> None:
    """A stage's result file (a stage's own process, or the job after a Slurm job array), checked first."""
    check(result, RESULT_SCHEMA, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)


def run_forwarding(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run `argv` (never through a shell) with this process's stdio; SIGTERM/SIGINT reach it too."""
    if argv and argv[0] in ("python", "python3"):
        argv = [sys.executable, *argv[1:]]
    try:
        proc = subprocess.Popen(argv, env=env)
    except FileNotFoundError:
        raise UserError(f"'{argv[0]}' is not installed here", fix="run this stage in its image") from None

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_exec(args: argparse.Namespace) -> int:
    started = time.monotonic()
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UserError("nothing to run after --", field="exec")
    code = run_forwarding(argv)
    write_result(args.result, args.stage, started, code, {})
    return code


def _recorded(
    stage: str, main: Callable[[argparse.Namespace], dict[str, Any]]
) -> Callable[[argparse.Namespace], int]:
    """A stage's entry whose counts go into the stage's result file."""

    def run(args: argparse.Namespace) -> int:
        started = time.monotonic()
        counts = dict(main(args) or {})
        # A stage may return notes for its record beside its counts (what engine it measured, …).
        notes = counts.pop(NOTES, [])
        write_result(args.result, stage, started, 0, counts, notes)
        return 0

    return run


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m draftscope.pipeline", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True)
    p = sub.add_parser("exec", help="run an upstream command and record how it ended")
    p.add_argument("--result", default=None, help="where to write the result file")
    p.add_argument("stage")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(run=cmd_exec)
    for stage in registry.STAGES:
        for entry in stage.entries:
            p = sub.add_parser(entry.name, help=entry.help)
            if entry.recorded:
                p.add_argument("--result", default=None, help="where to write the result file")
                p.set_defaults(run=_recorded(stage.name, entry.main))
            else:
                p.set_defaults(run=entry.main)
            entry.add_arguments(p)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run_main(args.run, args)
    except KeyboardInterrupt as exc:  # Ctrl-C, or the runtime's SIGTERM (servers.py): the servers are stopped
        print("interrupted; what was written is whole, and a rerun resumes", file=sys.stderr)
        # End by the signal itself, so whoever waits on this process (the runtime's record) sees which one.
        signum = signal.SIGTERM if str(exc) == f"signal {int(signal.SIGTERM)}" else signal.SIGINT
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + int(signum)  # not reached


if __name__ == "__main__":
    sys.exit(main())
