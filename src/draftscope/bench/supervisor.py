"""The benchmark supervisor (host side): run directory, manifest, the worker in its image under a hard limit,
then the summary and the final status. Imports no torch.

Lifecycle: preflight (pins, image, engine) → create the run directory (exclusive) → `running` → each step of the
plan through the runtime → summary from whatever records exist → `completed` only if every step succeeded and
every artifact validates; otherwise `timed_out` / `interrupted` / `failed` with the reason, records kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftscope.bench.plan import Plan, plan_benchmark
from draftscope.bench.progress import Progress
from draftscope.bench.stopping import expired, signal_words, stop_leftover_step, unfinished
from draftscope.bench.worker import FAILPOINT
from draftscope.core import hardware, settings
from draftscope.core.config import to_dict
from draftscope.core.datasets import selected
from draftscope.core.errors import UserError
from draftscope.core.hub import is_pinned
from draftscope.core.jsonio import read_json
from draftscope.core.platforms import require_linux
from draftscope.core.presets import ExperimentConfig, pin_fix
from draftscope.core.progress import print_tail
from draftscope.core.provenance import shell_join, versions
from draftscope.core.rundir import RECORDS, SUMMARY, InputFile, RunDir
from draftscope.core.summary import read_records, summarize
from draftscope.head.vllm_switch import read_status
from draftscope.runtime import Context, Outcome, Runtime, get_runtime
from draftscope.runtime.base import interrupted_reason, stop_signals

Printer = Callable[[str], None]


def context_for(output: Path) -> Context:
    output = Path(output).absolute()
    return Context(run_dir=output, run_id=output.name)


def dry_run_lines(plan: Plan, runtime: Runtime, output: Path) -> list[str]:
    ctx = context_for(output)
    lines = []
    for step in plan.steps:
        argv = runtime.argv(step, ctx)
        lines.append(f"# step {step.name} (image {step.image}, runtime {runtime.name})")
        if step.by_name:
            given = settings.present(step.by_name)
            lines.append(
                f"#   by name (values never recorded): {', '.join(step.by_name)}; set here: {', '.join(given) or 'none'}"
            )
        lines.append(_join(argv))
    lines.extend(plan.backend.dry_run_lines(plan.experiment, plan.preset))
    return lines


def _join(argv: list[str]) -> str:
    return shell_join(argv)


def preflight(plan: Plan, runtime: Runtime, *, here: bool = True) -> None:
    """Everything that can be refused before a run directory exists: no partial state on bad input. `here=False`
    (the Slurm executor's submitting host, which may have neither): the images and the GPU are left to the
    supervisor in the job, which runs this preflight again on its node."""
    backend = plan.backend
    if backend.linux_only:
        require_linux(backend.name, field="--backend")
    for download in plan.downloads:
        if not is_pinned(download.revision):
            raise UserError(
                f"{download.role} {download.repo} has no pinned revision",
                field="revision",
                fix=pin_fix(download.role, download.repo),
            )
    if not here:
        return
    if runtime.uses_images:
        runtime.check_images(s.image for s in plan.steps)  # a UserError naming a missing image and its build
    elif any(s.gpus for s in plan.steps):
        require_nvidia_gpu()


def require_nvidia_gpu() -> None:
    """A GPU step run in this environment (`--runtime local`) needs an NVIDIA GPU here; without one it is refused
    before a run directory exists. (Through a container engine, the engine's own refusal is the run's failure.)"""
    if hardware.nvidia_gpus_present():
        return
    other = hardware.unsupported_accelerators(hardware.Probes())
    found = ", ".join(f"{a['vendor']} {a['stack']} ({a['evidence']})" for a in other)
    raise UserError(
        "no NVIDIA GPU found (neither NVML nor nvidia-smi answers)"
        + (f"; found {found}, which the kit does not support" if found else ""),
        field="--device",
        value="cuda",
        fix="run on a host with an NVIDIA GPU and its driver (invoke doctor), or --device cpu with --preset tiny",
    )


def run_benchmark(
    config: ExperimentConfig,
    output: Path,
    *,
    argv: list[str],
    say: Printer = print,
    kind: str = "benchmark",
    notes: Sequence[str] = (),
    explain: Callable[[Outcome], Outcome] | None = None,
    grace_seconds: float | None = None,
) -> dict[str, Any]:
    """Run one benchmark into a new run directory; `kind="reproduce"` (with `notes`) marks a reproduction.
    `explain` may restate how a step ended before it is recorded (inside a Slurm job: a SIGTERM is Slurm's time
    limit or a cancellation, which Slurm is asked about); `grace_seconds` bounds how long a stopped step may take
    to end before it is killed (inside a job: less than Slurm's KillWait)."""
    plan = plan_benchmark(config, str(output))
    runtime = get_runtime(config.runtime)
    preflight(plan, runtime)

    # SIGTERM is handled like Ctrl-C from here on: during creation the half-made folder is removed, later the
    # step is stopped and the run is recorded as interrupted. Only the first signal interrupts: any later one is
    # counted while the step is stopped and the run is finished (`StopSignals`), within a bound.
    with stop_signals() as signals:
        run = RunDir.create(
            output,
            kind=kind,
            config=to_dict(config),
            argv=argv,
            inputs=[InputFile("prompts", Path(plan.prompts.path), plan.prompts.sha256, plan.prompts.source)],
            software={"host": versions()},
        )
        supervision = run.supervision
        signals.on_expiry = lambda signum: expired(run, supervision, signum, signals.bound)
        steps: list[dict[str, Any]] = []  # each step's outcome, filled in as they end
        try:
            ctx = replace(context_for(output), on_start=supervision.step if supervision else None)
            if grace_seconds is not None:
                ctx = replace(ctx, grace_seconds=grace_seconds)
            (run.path / RECORDS).touch()  # a run killed before its first record still has the file
            images = _image_facts(plan, runtime, ctx)
            run.update(images=images)
            for text in notes:
                run.note(text)
            if settings.DRAFTSCOPE_FAILPOINT.raw():
                run.note(f"fault injection was active: {FAILPOINT}={settings.DRAFTSCOPE_FAILPOINT.raw()}")
            run.set_status("running")
            outcome = _run_steps(plan, runtime, ctx, run, say, steps, explain)
            signals.shield()  # the steps are over: a signal from here on no longer aborts their record
        except KeyboardInterrupt as exc:
            reason = interrupted_reason(exc).split(";")[0]
            outcome = Outcome("benchmark", "interrupted", None, 0.0, reason, None)
            if explain is not None:
                outcome = explain(outcome)
        signals.shield()
        if signals.first is not None and supervision is not None:
            with contextlib.suppress(OSError):  # the lock file's story; the run's own record comes next
                supervision.stopping(signal_words(signals.first))
        left = stop_leftover_step(supervision, grace_seconds or 5.0)
        if left:
            # The step outlived SIGKILL (stuck in the kernel): a summary now could miss what it still writes.
            return unfinished(run, supervision, signals.first, left)
        manifest = finish(run, plan, outcome, steps)
        if signals.later:
            with contextlib.suppress(OSError, UserError):
                run.note(f"{signals.later} more stop signal(s) arrived while the run was being finished")
        return manifest


def _image_facts(plan: Plan, runtime: Runtime, ctx: Context) -> list[dict[str, Any]]:
    facts = []
    for step in plan.steps:
        facts.append({"step": step.name, "runtime": runtime.name, **runtime.image_facts(step.image)})
    return facts


def _run_steps(
    plan: Plan,
    runtime: Runtime,
    ctx: Context,
    run: RunDir,
    say: Printer,
    steps_state: list[dict[str, Any]],
    explain: Callable[[Outcome], Outcome] | None = None,
) -> Outcome:
    outcome: Outcome | None = None
    for step in plan.steps:
        watcher = Progress(run.path / RECORDS, plan.prompts.count * plan.experiment.repeats, say)
        argv = runtime.argv(step, ctx)  # exactly what runs (and what --dry-run prints)
        # What the step received by name from this environment (credentials, the fetch step's proxy or mirror):
        # the names only, as the argv holds them.
        named = {"by_name": given} if (given := settings.present(step.by_name)) else {}
        # Recorded as running before it starts: a supervisor killed outright leaves the step named.
        with contextlib.suppress(OSError):
            run.update(steps=[*steps_state, {"name": step.name, "status": "running", "argv": argv, **named}])
        say(f"{step.name}: started; log: {ctx.run_dir / 'logs' / f'{step.name}.log'}")
        if step.name == "benchmark":
            watcher.start()
        try:
            outcome = runtime.run(step, ctx)
        finally:
            watcher.stop()
        if explain is not None:
            outcome = explain(outcome)
        if not outcome.ok:
            code = "" if outcome.exit_code is None else f" (exit code {outcome.exit_code})"
            if outcome.exit_code is not None and outcome.exit_code < 0:
                code = f" (signal {-outcome.exit_code})"
            say(f"{step.name}: {outcome.status}{code} after {outcome.seconds:.1f} s")
            print_tail(outcome.log, say)
        steps_state.append(
            {
                "name": step.name,
                "status": outcome.status,
                "exit_code": outcome.exit_code,
                "seconds": round(outcome.seconds, 3),
                "argv": argv,
                **named,
            }
        )
        with contextlib.suppress(OSError):  # a full disk: `finish` records the steps once it has room
            run.update(steps=steps_state)
        if not outcome.ok:
            break
    assert outcome is not None
    return outcome


def finish(run: RunDir, plan: Plan, outcome: Outcome, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps, summary and final status. The space reserved at creation is given back first, so that a disk filled
    during the run still has room for them; the disk being full is then named as the reason."""
    full = _disk_full(run.path)
    run.release_reserve()
    outcome = _with_recorded_stop(run, outcome)
    if full and not outcome.ok:
        outcome = _with_reason(outcome, f"{full}; {outcome.reason}")
    try:
        run.update(steps=steps)  # also replaces a step recorded as running that never got to start
        return _summarize_and_close(run, plan, outcome)
    except (OSError, UserError) as exc:
        # The summary could not be written or the records could not be read: the run failed, and says why.
        what = exc.render() if isinstance(exc, UserError) else f"{exc.strerror or exc}"
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            what = f"the disk holding the run directory is full ({what})"
        reason = f"the run could not be finished: {what}" + (f"; {outcome.reason}" if outcome.reason else "")
        (run.path / SUMMARY).unlink(missing_ok=True)  # never a summary that does not match the records
        try:
            return run.set_status("failed", reason)
        except OSError as again:
            raise UserError(
                f"the run's final status could not be recorded: {again.strerror or again}",
                source=str(run.path),
                fix="free disk space; the records written so far are kept in records.jsonl",
            ) from None


def _with_recorded_stop(run: RunDir, outcome: Outcome) -> Outcome:
    """When finishing a run for `invoke recover`: what its supervisor wrote in the lock file about how it was stopping
    (`Supervision.stopping`, e.g. a Ctrl-C whose step outlived SIGKILL) comes first in the reason. Text only, cut
    short: the lock file is data, whoever wrote it."""
    info = run.supervision.info if run.supervision is not None else {}
    stopping = info.get("stopping")
    if (
        not info.get("recovering")
        or not isinstance(stopping, dict)
        or not isinstance(stopping.get("why"), str)
    ):
        return outcome
    why = " ".join(stopping["why"].split())[:400]
    return _with_reason(outcome, f"its supervisor recorded: {why}; then {outcome.reason}")


def _with_reason(outcome: Outcome, reason: str) -> Outcome:
    return Outcome(outcome.step, outcome.status, outcome.exit_code, outcome.seconds, reason, outcome.log)


def _disk_full(path: Path, margin: int = 64 * 1024) -> str | None:
    """A reason naming a full disk, when the run directory's file system has (almost) no space left."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    return f"no space left on the run directory's file system ({free} bytes free)" if free < margin else None


def _summarize_and_close(run: RunDir, plan: Plan, outcome: Outcome) -> dict[str, Any]:
    worker = run.path / "worker.json"
    if worker.exists():
        facts = read_json(worker)
        manifest = run.manifest()
        software = {
            **manifest.get("software", {}),
            "worker": facts.get("versions"),
            "backend": facts.get("backend"),
            "load_seconds": facts.get("load_seconds"),
            "warmup_seconds": facts.get("warmup_seconds"),
            "worker_phase": facts.get("phase"),
        }
        if plan.experiment.experimental_prefix:
            software["prefix_head"] = read_status(run.path)
        run.update(hardware=facts.get("hardware"), software=software)
    records = read_records(run.path)
    # The run's own copy: the user's file may have been edited or deleted since the run began.
    prompts = read_json(run.input_copy("prompts"))["prompts"]
    prompt_ids = [p["id"] for p in selected(prompts, plan.experiment.max_prompts)]
    expected = len(prompt_ids) * plan.experiment.repeats
    if outcome.ok and len(records) != expected:
        # Exit code 0 is not enough: the worker must have written every record.
        outcome = Outcome(
            outcome.step,
            "failed",
            outcome.exit_code,
            outcome.seconds,
            f"the worker exited 0 with {len(records)} of {expected} records written",
            outcome.log,
        )
    summary = summarize(run.path.name, records, prompt_ids, partial=not outcome.ok)
    run.write_summary(summary)
    if outcome.ok:
        return run.complete()
    return run.set_status(outcome.status, _reason(plan, outcome))


def _reason(plan: Plan, outcome: Outcome) -> str | None:
    """Name out-of-memory as the cause when the step's log shows it, by torch's words or the backend's own (vLLM's
    engine process reports it early in the log, before the lines the generic reason quotes)."""
    if outcome.status != "failed" or outcome.log is None or not outcome.log.exists():
        return outcome.reason
    if (outcome.reason or "").startswith(
        "out of memory"
    ):  # the engine named it, with the limit (runtime.base)
        return outcome.reason
    markers = ("out of memory", "OutOfMemoryError", *plan.backend.oom_markers)
    text = outcome.log.read_text(encoding="utf-8", errors="replace")
    if any(m in text for m in markers):
        return f"out of memory (step '{outcome.step}', exit code {outcome.exit_code}); see {outcome.log.name}"
    return outcome.reason
