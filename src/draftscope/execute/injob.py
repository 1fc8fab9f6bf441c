"""Inside a batch job, whichever launcher submitted it: what every in-job entry point needs (the pipeline's
`python -m draftscope.pipeline.batch`, a benchmark's `python -m draftscope.bench.batch`), whatever step it runs.

`here()` is the in-job side of the launcher whose job this process runs in (`execute.base.JobNode`: the job's id,
nodes, stop grace, why it was stopped, its record entry); outside any job (the submitting host, a job script run by
hand) the first batch launcher's, which then finds no job and answers plainly. The rest is the same under every
scheduler, each of which stops a job with SIGTERM before it kills it: `stops_interrupt` turns that SIGTERM into the
KeyboardInterrupt the runtimes already handle (they stop the step: its container by name, or the local process
group); `remove_container` is the job script's SIGTERM trap (stopping the job ends the engine's client, not the
container it started); `main_guard` gives every in-job command the same exit codes: 2 for a user error (one line),
143 when stopped before anything could be recorded.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

from draftscope.core.errors import run_main
from draftscope.execute import registry
from draftscope.execute.base import JobNode

Say = Callable[[str], None]


def here() -> JobNode:
    nodes = registry.nodes()
    return next((n for n in nodes if n.in_job()), nodes[0])


def say(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def stops_interrupt() -> Iterator[None]:
    """The scheduler's SIGTERM interrupts the wait for the step (as Ctrl-C does), once: the runtime then stops the
    step and the record is written before the scheduler kills the job. A second SIGTERM is ignored meanwhile."""

    def stopped(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def remove_container(engine: str | None, name: str) -> None:
    """Remove a container now, by the name the runtime gave it (docker, podman; anything else has none)."""
    if engine not in ("docker", "podman"):
        return
    # No grace: the scheduler's SIGKILL follows within seconds; --init has already passed SIGTERM to the step.
    extra = ["--time", "0"] if engine == "podman" else []
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([engine, "rm", "--force", *extra, name], capture_output=True, timeout=30, check=False)


def main_guard(fn: Callable[[], int]) -> int:
    """Run an in-job command under the scheduler's SIGTERM handling: user errors as one line (exit 2, `run_main`),
    a stop before anything could be recorded as 143."""
    try:
        with stops_interrupt():
            return run_main(fn)
    except KeyboardInterrupt:
        print("stopped (SIGTERM) before the step could be recorded", file=sys.stderr, flush=True)
        return 143
