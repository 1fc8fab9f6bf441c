"""The local runtime: the step's in-container argv, run in this Python environment.

Container paths in the argv and environment (mount targets) are mapped back to their host sources, and
`python` is this interpreter; nothing else differs from a container run. Used for CPU runs, CI and the demo.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from draftscope.core import settings
from draftscope.runtime.base import (
    ENV_ALLOW,
    NO_IMAGE,
    Context,
    Outcome,
    die_with_parent,
    log_path,
    outcome_from_exit,
    supervise,
)
from draftscope.runtime.step import RUN_MOUNT, Step

# What a local step inherits from this process besides the allowed variables: enough to find programs, speak the
# locale, write temporary files and import the kit; nothing else of the host's environment.
LOCAL_BASE = (
    settings.PATH,
    settings.LANG,
    settings.LC_ALL,
    settings.TMPDIR,
    settings.HOME,
    settings.PYTHONPATH,
)


def _mapper(step: Step, ctx: Context) -> Callable[[str], str]:
    pairs = sorted(((m.target, m.source) for m in step.mounts), key=lambda p: -len(p[0]))

    def rewrite(value: str) -> str:
        for target, source in pairs:
            if value == target or value.startswith(target + "/"):
                host = str(ctx.run_dir) if target == RUN_MOUNT else source
                return host + value[len(target) :]
        return value

    return rewrite


class LocalRuntime:
    name = "local"
    uses_images = False  # the in-container argv runs in this Python environment

    def image_facts(self, image: str) -> dict[str, Any]:
        return dict(NO_IMAGE)

    def check_images(self, images: Iterable[str]) -> None:
        return None

    def image_reference(self, image: str) -> str | None:
        return None

    def with_host_network(self) -> LocalRuntime:
        return self  # local processes already share the host's network

    def with_recorded_image(self, facts: Mapping[str, Any]) -> LocalRuntime:
        return self

    def argv(self, step: Step, ctx: Context) -> list[str]:
        rewrite = _mapper(step, ctx)
        argv = [rewrite(a) for a in step.argv]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        return argv

    def env(self, step: Step, ctx: Context) -> dict[str, str]:
        rewrite = _mapper(step, ctx)
        base = settings.named(v.name for v in LOCAL_BASE)
        base.update(settings.named((*ENV_ALLOW, *step.env_passthrough, *step.credentials)))
        base.update({k: rewrite(v) for k, v in step.env.items()})
        base.update(ctx.extra_env)
        base[settings.PYTHONUNBUFFERED.name] = "1"
        return base

    def run(self, step: Step, ctx: Context) -> Outcome:
        log = log_path(ctx, step)
        started = time.monotonic()
        with log.open("ab") as out:
            # A new session: on expiry the whole process group is signalled, children included.
            proc = subprocess.Popen(
                self.argv(step, ctx),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(step, ctx),
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

            def stop() -> None:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=ctx.grace_seconds)
                except subprocess.TimeoutExpired:
                    _signal_group(proc, signal.SIGKILL)

            try:
                ctx.started(step.name, pgid=proc.pid)
            except BaseException:  # Ctrl-C before the supervised wait: the step must not run on unsupervised
                stop()
                raise
            state, reason = supervise(proc, max_seconds=step.max_seconds, stop=stop, started=started)
        seconds = time.monotonic() - started
        if state != "exited":
            return Outcome(step.name, state, proc.returncode, seconds, reason, log)
        return outcome_from_exit(step, proc.returncode, seconds, log, None)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
