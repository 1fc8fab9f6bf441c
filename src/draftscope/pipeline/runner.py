"""Running a pipeline plan (host side): preflight, then each stage through the runtime, then its record.

Mirrors the benchmark supervisor: everything that can be refused is refused before anything starts (unpinned
target, missing inputs or images, a stage with no runner on this device, busy ports); each stage runs in its image
under the runtime's hard limit; a stage counts as completed only when its outputs exist and validate against their
schemas, and its record (`stages/<stage>.json`) is written either way. A failed stage stops the pipeline.

The workdir is not a one-shot run directory: it accumulates stages, and a rerun skips every stage whose record
says it completed with the same inputs and command (`--force` reruns). `pipeline.json` holds the frozen config of
the latest invocation; `invocations.jsonl` keeps one line per invocation.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, so a workdir is not locked there
    fcntl = None

from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.hardware import nvidia_gpus_present
from draftscope.core.jsonio import JsonlAppender, atomic_write_json, read_json
from draftscope.core.platforms import refusal
from draftscope.core.progress import print_tail, watching
from draftscope.core.provenance import command_line, kit_info, now
from draftscope.core.schema import problems
from draftscope.execute.outcomes import StageOutcome, in_order
from draftscope.pipeline import plan as planning
from draftscope.pipeline import state
from draftscope.pipeline.base import CONFIG_FILE, STAGES_DIR, ResolvedInstance, StageContext, check_ports_free
from draftscope.pipeline.plan import PipelinePlan, StagePlan
from draftscope.pipeline.progress import StageProbe
from draftscope.runtime import Context, Outcome, Runtime
from draftscope.runtime.step import Step
from draftscope.tiny.assets import require_files

Printer = Callable[[str], None]


def not_built(sp: StagePlan, ctx: StageContext) -> str | None:
    """Why a stage cannot run on this device, if it cannot (its declaration says: SGLang has no CPU path)."""
    if ctx.cpu and sp.stage.cpu_refusal:
        return f"{sp.stage.name} {sp.stage.cpu_refusal}"
    return None


def engine_refusal(sp: StagePlan, preset_source: str) -> str | None:
    """Why this host cannot run the engine the stage starts (vLLM, SGLang: Linux only). The tiny preset's path
    starts none: its loopback server and Transformers extractor run anywhere."""
    engine = sp.stage.engine
    return refusal(engine) if engine and preset_source != "kit" else None


# --- preflight ------------------------------------------------------------------------------------------------


def fetch_step(plan: PipelinePlan) -> Step | None:
    """Download the pinned target snapshot first (network, transformers image) when the hub cache lacks it."""
    return planning.fetch_step(plan) if planning.fetch_needed(plan) else None


def _produced_by_earlier(path: Path, produced: list[Path]) -> bool:
    return any(path == p or p in path.parents or path in p.parents for p in produced)


def preflight(plan: PipelinePlan, runtime: Runtime, *, check_gpus: bool = True) -> None:
    """Everything that can be refused before anything is written: unpinned targets, missing inputs (external,
    or produced by a stage that is neither selected nor completed), GPU stages without a GPU, missing images."""
    ctx = plan.context
    preset = plan.preset
    if preset.hub is not None and plan.config.model_path is None:
        preset.hub.require_pinned(
            f"target of preset '{preset.name}'",
            fix=f"set hub.revision in the model preset '{preset.name}' to a full 40-character commit SHA you checked "
            "(presets/models/, or a copy under DRAFTSCOPE_PRESETS), or give a local checkpoint (--opts model_path=DIR)",
        )
    if plan.config.model_path is not None and not Path(plan.config.model_path).is_dir():
        raise UserError("model_path is not a folder", field="model_path", value=plan.config.model_path)
    if preset.source == "kit":
        require_files(preset)
    for sp in plan.stages:
        reason = not_built(sp, ctx) or engine_refusal(sp, preset.source)
        if reason:
            raise UserError(
                reason, field="--stage", value=sp.stage.name, fix="run the other stages, or --dry-run"
            )
        if ctx.cpu:
            sp.stage.cpu_check(ctx)
        if any(a.name == "chat" for a in sp.inputs) and "chat" not in ctx.inputs:
            raise UserError(
                f"stage {sp.stage.name} reads chat rows and none are configured",
                field="data.chat",
                fix="add --opts data.chat=PATH.jsonl or set data.chat in the run config",
            )
    produced: list[Path] = []
    for sp in plan.stages:
        for artifact in sp.inputs:
            if artifact.name in ctx.inputs or not artifact.required:
                continue
            if not _produced_by_earlier(artifact.path, produced) and not artifact.path.exists():
                raise UserError(
                    f"stage {sp.stage.name} needs {artifact.name} at {artifact.path}, which does not exist",
                    field="--stage",
                    fix="run the stage that produces it first (or --stage all)",
                )
        produced += [a.path for a in sp.outputs]
    gpu_stages = [sp.stage.name for sp in plan.stages if sp.stage.uses_gpu]
    if check_gpus and not ctx.cpu and gpu_stages and not nvidia_gpus_present():
        raise UserError(
            f"stage {gpu_stages[0]} needs an NVIDIA GPU (device: cuda) and none was found",
            field="device",
            fix="run on a GPU host (invoke doctor), or use the tiny preset (device cpu) on a CPU",
        )
    used = {a.name for sp in plan.stages for a in sp.inputs}
    for name, path in ctx.inputs.items():
        if name in used and not path.is_file():
            found = path.exists() or path.is_symlink()
            what = (
                "not a regular file (a folder, a pipe, a device or a broken link)"
                if found
                else "input file not found"
            )
            raise UserError(what, field=name, value=str(path), fix="give the path of a regular file")
    check_inputs(plan)
    fetch = fetch_step(plan)
    runtime.check_images([sp.step.image for sp in plan.stages] + ([fetch.image] if fetch else []))


def check_inputs(plan: PipelinePlan) -> None:
    """Each stage reads what it takes from outside the workdir (the chat rows) once, before anything is written, so
    a malformed file leaves no state behind; what it checks is the stage's own declaration (`Stage.check_inputs`)."""
    for sp in plan.stages:
        sp.stage.check_inputs(plan.context)


def stage_preconditions(sp: StagePlan, ctx: StageContext) -> None:
    """Right before a stage starts: its inputs exist, its servers' ports are free."""
    absent = state.missing(sp.inputs)
    if absent:
        first = absent[0]
        raise UserError(
            f"stage {sp.stage.name} needs {first.name} at {first.path}, which does not exist",
            field="--stage",
            fix="run the stage that produces it first (or --stage all)",
        )
    servers = [c for c in sp.commands if c.port is not None]
    if servers:
        check_ports_free(
            [ResolvedInstance(i, c.gpus, max(1, len(c.gpus)), c.port) for i, c in enumerate(servers)],
            f"{sp.stage.name}.instances",
        )


# --- running ----------------------------------------------------------------------------------------------------


def write_frozen_config(plan: PipelinePlan, argv: list[str]) -> None:
    workdir = plan.workdir
    (workdir / STAGES_DIR).mkdir(parents=True, exist_ok=True)
    frozen = {
        "schema_version": 1,
        "config": plan.config.to_dict(),
        "model_preset": plan.preset.name,
        "source": plan.source,
        "runtime": plan.runtime,
        "stages": [sp.stage.name for sp in plan.stages],
        "kit": kit_info(),
        "command_line": command_line(argv),
        "written_at": now(),
    }
    atomic_write_json(workdir / CONFIG_FILE, frozen)
    with JsonlAppender(workdir / "invocations.jsonl") as log:
        log.append(frozen)


LOCK_FILE = ".draftscope.lock"


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """One invocation at a time on a workdir: a second one is refused (two would write the same rows and
    records). An OS lock (`flock`), released whatever ends the process; where there is none (Windows), no lock."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_FILE
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"another invocation is working in this workdir ({holder})",
                field="--workdir",
                value=str(workdir),
                fix="wait for it to finish (or stop it), or use another --workdir",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def run_pipeline(
    plan: PipelinePlan,
    runtime: Runtime,
    *,
    force: bool = False,
    argv: list[str] | None = None,
    say: Printer = print,
) -> list[StageOutcome]:
    preflight(plan, runtime)
    with workdir_lock(plan.workdir):
        try:
            return _run_locked(plan, runtime, force=force, argv=argv, say=say)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise UserError(
                f"no space left to write in the workdir ({exc.strerror}: {exc.filename or '?'}); the stage's "
                "outputs so far are whole (every write is atomic or line-at-a-time)",
                field="--workdir",
                value=str(plan.workdir),
                fix="free space (or move the workdir), then rerun: completed stages are skipped, regen resumes",
            ) from None


def _run_locked(
    plan: PipelinePlan, runtime: Runtime, *, force: bool, argv: list[str] | None, say: Printer
) -> list[StageOutcome]:
    write_frozen_config(plan, argv if argv is not None else sys.argv)
    ctx = Context(run_dir=plan.workdir, run_id=plan.workdir.name)
    fetch = fetch_step(plan)
    if fetch is not None:
        named = settings.present(fetch.by_name)  # credentials, proxy, mirror: names only
        say(
            f"fetch: downloading {plan.preset.hub.display()} into the hub cache"  # type: ignore[union-attr]
            + (f"; given by name: {', '.join(named)}" if named else "")
        )
        result = runtime.run(fetch, ctx)
        if not result.ok:
            return [StageOutcome("fetch", result.status, result.reason, result.seconds)]
    # Stage by stage, up to the first that did not complete (as a batch submission's outcomes are read).
    return in_order(plan.stages, lambda sp: run_stage(plan, sp, runtime, ctx, force=force, say=say))


def run_stage(
    plan: PipelinePlan,
    sp: StagePlan,
    runtime: Runtime,
    ctx: Context,
    *,
    force: bool,
    say: Printer,
    execute: Callable[[Step, Context], Outcome] | None = None,
    extra: Mapping[str, Any] | None = None,
    preconditions: bool = True,
) -> StageOutcome:
    """Run one stage unless its record lets it be skipped, and record how it ended. `execute` replaces
    `runtime.run` (in a batch job: a job array's shards merged, the scheduler's stop classified), `extra` adds
    fields to the record (the job), `preconditions=False` skips the inputs and free-ports check (a merge starts no
    server); the skip check, the argv and the record are the same either way."""
    name = sp.stage.name
    argv = runtime.argv(sp.step, ctx)
    commands = [c.to_dict() for c in sp.commands]
    image = _image_facts(sp.step, runtime)
    config_hash = state.config_sha256(argv, commands, image["reference"])
    inputs = state.fingerprints(sp.inputs)
    previous = state.read_record(plan.workdir, name)
    reason = state.skip_reason(previous, config_hash=config_hash, inputs=inputs, outputs=sp.outputs)
    if reason and not force:
        say(f"{name}: skipped ({reason})")
        return StageOutcome(name, "skipped", reason)
    if preconditions:
        stage_preconditions(sp, plan.context)
    stages_dir = plan.workdir / STAGES_DIR
    if commands:
        atomic_write_json(
            stages_dir / f"{name}.commands.json", {"schema_version": 1, "stage": name, "commands": commands}
        )
    result_file = stages_dir / f"{name}.result.json"
    result_file.unlink(missing_ok=True)
    say(f"{name}: running in {sp.step.image if runtime.name != 'local' else 'this environment'}")
    log = ctx.run_dir / "logs" / f"{sp.step.name}.log"
    if execute is None:  # (a batch job's output is named by its launcher)
        say(f"{name}: log: {log}")
    started_at = now()
    probe = StageProbe(sp, log)
    with watching(name, probe, say=say, unit=probe.unit):
        outcome = (execute or runtime.run)(sp.step, ctx)
    result = read_json(result_file, expect=dict) if result_file.is_file() else {}
    status, why = outcome.status, outcome.reason
    notes = list(sp.notes)
    if outcome.ok:
        why = _check_outputs(sp)
        if why:
            status = "failed"
    record: dict[str, Any] = {
        "schema_version": 1,
        "stage": name,
        "status": status,
        "reason": why,
        "draft": plan.config.draft,
        "model_preset": plan.preset.name,
        "runtime": runtime.name,
        "image": image,
        "argv": argv,
        "commands": commands,
        "config_sha256": config_hash,
        "inputs": inputs,
        "outputs": state.fingerprints(sp.outputs) if status == "completed" else [],
        "versions": dict(result.get("versions") or {}),
        "counts": dict(result.get("counts") or {}),
        "started_at": started_at,
        "finished_at": now(),
        "seconds": round(outcome.seconds, 3),
        "notes": notes + list(result.get("notes") or []),
        **(extra or {}),
    }
    state.write_record(plan.workdir, record)
    say(f"{name}: {status}" + (f" ({why})" if why else "") + f" in {outcome.seconds:.1f} s")
    if not outcome.ok:
        print_tail(outcome.log, say)
    return StageOutcome(name, status, why, outcome.seconds)


def _check_outputs(sp: StagePlan) -> str | None:
    """Every declared output exists and every schema'd one validates; the first problem, else None."""
    absent = state.missing(sp.outputs)
    if absent:
        return f"output {absent[0].name} missing at {absent[0].path}"
    for artifact in sp.outputs:
        if artifact.schema:
            found = problems(read_json(artifact.path), artifact.schema)
            if found:
                return f"{artifact.path}: {found[0].path}: {found[0].message}"
    return None


def _image_facts(step: Step, runtime: Runtime) -> dict[str, Any]:
    return {"name": step.image, **runtime.image_facts(step.image)}
