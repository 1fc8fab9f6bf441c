"""regen and hsextract as job arrays: each task runs one shard of the stage; one more job accounts for all.

regen: shard I of N takes input rows k with k mod N == I (`regen_client --shard I --shards N`, a split that does
not depend on what earlier attempts finished) and runs the stage's own step with its own files, so that tasks on
one node or one shared folder never touch each other's:
- output `regen/shards/I/` (rows, errors, summary; a rerun resumes there by row id),
- commands `stages/regen.shard-I.commands.json`: the stage's servers with ports moved up by I × instances
  (CPU shards share a node; GPU shards have whole nodes, where the shift is harmless),
- result `stages/regen.shard-I.result.json`, server logs `logs/regen.shard-I/`, container `…-regen.shard-I-…`.
Each task writes how it ended to `slurm/shards/regen/I.json` (`running` first, before its step starts: a task
killed before it can write its end is then explained from the scheduler's record of it, `task_accounts`).

The merge job then checks every shard completed and accounts for every input row (ok + errors == input, no id
twice, no row missing), and writes the stage's outputs as a single run writes them: `regen/rows.jsonl` and
`regen/errors.jsonl` as the shards wrote each line, in input order, and `regen/summary.json` (schema
`stage-regen`) with every shard's instances. With one instance and one request at a time these files are
byte-identical to a single run's.

hsextract: the rows are split as speculators' clients split them (contiguous blocks by world size and rank; the
ranks of a world partition the rows). Real presets: task I of N runs its k instances' servers on ports + I × k
with their own scratch folders (`hsextract/shards/I/scratch-<i>`) and its clients as ranks I*k+i of a world of
N*k; the tiny preset: the Transformers extractor with `--world-size N --rank I`. Every task writes straight into the shared `hidden_states/` (one file per
row, so nothing is merged); its commands, result, logs and summary are its own (`stages/hsextract.shard-I.*`,
`logs/hsextract.shard-I/`, `hsextract/shards/I/summary.json`), its outcome `slurm/shards/hsextract/I.json`. A check
job (`afterany`) then runs the stage's whole-output check in the stage's image (`hsextract-check`: every row has its
`hs_<row>.safetensors`, sampled shapes) and writes `hsextract/summary.json` and the stage record, or records the
stage failed naming the shards that did not complete or the rows without a file.

Over ~400 lines on purpose: the shard split, each task's files and the merge and check jobs' accounting must agree
row for row.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, parse_json, read_json
from draftscope.core.schema import check
from draftscope.execute.base import TaskEnd
from draftscope.execute.injob import here
from draftscope.execute.outcomes import worst
from draftscope.pipeline.__main__ import RESULT_SCHEMA_VERSION, save_result
from draftscope.pipeline.base import Command, ResolvedInstance, StageContext
from draftscope.pipeline.batch.layout import JOBS_DIR, ledger_path
from draftscope.pipeline.plan import PipelinePlan, StagePlan
from draftscope.pipeline.stages import hsextract, regen
from draftscope.pipeline.stages.regen.client import account, read_rows, shard_rows
from draftscope.runtime import Context, Outcome, Runtime
from draftscope.runtime.step import Step

STAGE = "regen"
HSEXTRACT = "hsextract"
MAX_PORT = 65535


def step_name(shard: int, stage: str = STAGE) -> str:
    return f"{stage}.shard-{shard}"


def check_name(stage: str = HSEXTRACT) -> str:
    return f"{stage}.check"


def output_dir(workdir: Path, shard: int, stage: str = STAGE) -> Path:
    return workdir / stage / "shards" / str(shard)


OUTCOME_SCHEMA = "slurm-shard"  # slurm/shards/<stage>/<I>.json


def outcomes_dir(workdir: Path, stage: str = STAGE) -> Path:
    return workdir / JOBS_DIR / "shards" / stage


def outcome_path(workdir: Path, shard: int, stage: str = STAGE) -> Path:
    return outcomes_dir(workdir, stage) / f"{shard}.json"


def commands_path(workdir: Path, shard: int, stage: str = STAGE) -> Path:
    return workdir / "stages" / f"{step_name(shard, stage)}.commands.json"


def result_path(workdir: Path, shard: int, stage: str = STAGE) -> Path:
    return workdir / "stages" / f"{step_name(shard, stage)}.result.json"


def _moved(found: Sequence[ResolvedInstance], shard: int, field: str) -> list[ResolvedInstance]:
    """The instances with ports moved up by shard × instances."""
    shift = shard * len(found)
    top = max(i.port for i in found) + shift
    if top > MAX_PORT:
        raise UserError(
            f"shard {shard} would need port {top}", field=field, fix=f"lower {field} or use fewer shards"
        )
    return [ResolvedInstance(i.index, i.gpus, i.tp, i.port + shift) for i in found]


def shard_commands(ctx: StageContext, shard: int, shards: int = 1, stage: str = STAGE) -> list[Command]:
    """The stage's commands for one shard: the same servers, ports moved up by shard × instances; hsextract's
    servers with the shard's own scratch folders and its clients with the shard's ranks."""
    if stage == HSEXTRACT:
        if not hsextract.uses_vllm(ctx):
            return []
        found = _moved(hsextract.instances(ctx), shard, "hsextract.base_port")
        k = len(found)
        scratch = [ctx.layout.at(HSEXTRACT, "shards", str(shard), f"scratch-{i.index}") for i in found]
        return [hsextract.server_command(ctx, i, scratch=s) for i, s in zip(found, scratch, strict=True)] + [
            hsextract.client_command(ctx, i, shards * k, rank=shard * k + i.index) for i in found
        ]
    return [regen.server_command(ctx, i) for i in _moved(regen.instances(ctx), shard, "regen.base_port")]


def _set(argv: list[str], flag: str, value: str, *, required: bool = True) -> None:
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    elif required:  # the stage's argv changed shape: the shard would share files with the others
        raise RuntimeError(f"the {argv[3] if len(argv) > 3 else 'stage'} argv has no {flag}")
    else:
        argv += [flag, value]


def shard_step(sp: StagePlan, ctx: StageContext, shard: int, shards: int) -> Step:
    """The stage's step for one shard: the same argv with the shard's rows, files and ports."""
    at = ctx.layout.at
    stage = sp.stage.name
    name = step_name(shard, stage)
    argv = list(sp.step.argv)
    _set(argv, "--result", at("stages", f"{name}.result.json"))
    if stage == HSEXTRACT:
        _set(argv, "--summary", at(HSEXTRACT, "shards", str(shard), "summary.json"))
        if "--commands" in argv:  # real presets: the runner, its servers and clients
            _set(argv, "--commands", at("stages", f"{name}.commands.json"))
            _set(argv, "--logs", at("logs", name), required=False)
        else:  # tiny: the Transformers extractor takes its block itself
            argv += ["--world-size", str(shards), "--rank", str(shard)]
        return replace(sp.step, name=name, argv=tuple(argv))
    _set(argv, "--commands", at("stages", f"{name}.commands.json"))
    _set(argv, "--output-dir", at(STAGE, "shards", str(shard)))
    _set(argv, "--logs", at("logs", name), required=False)
    argv += ["--shard", str(shard), "--shards", str(shards)]
    return replace(sp.step, name=name, argv=tuple(argv))


# --- the merge job ----------------------------------------------------------------------------------------------


def shard_outcomes(workdir: Path, shards: int, stage: str = STAGE) -> list[dict[str, Any] | None]:
    found: list[dict[str, Any] | None] = []
    for i in range(shards):
        path = outcome_path(workdir, i, stage)
        try:
            found.append(read_json(path) if path.is_file() else None)
        except Exception:  # a torn file: the shard did not finish recording
            found.append(None)
    return found


def array_job(workdir: Path, stage: str, outcomes: Sequence[dict[str, Any] | None]) -> str | None:
    """The stage's job array id: from a task's outcome, else (no task ever started) from the ledger's submission
    that holds this job (the merge or check job); None when neither says."""
    found = next((o.get("array_job_id") for o in outcomes if o and o.get("array_job_id")), None)
    if found:
        return str(found)
    return here().array_in(ledger_path(workdir), stage)


def task_accounts(array: str | None, outcomes: Sequence[dict[str, Any] | None]) -> dict[int, TaskEnd]:
    """Shard → the scheduler's record of its task, asked only when a shard left no final outcome (killed before it
    could write one, or cancelled before it started); empty when the array is unknown or the scheduler does not
    answer."""
    if not array or all(o is not None and o.get("status") != "running" for o in outcomes):
        return {}
    return here().task_ends(str(array))


def not_completed(
    outcomes: Sequence[dict[str, Any] | None], array_log: str, accounts: dict[int, TaskEnd] | None = None
) -> tuple[str, str] | None:
    """(status, reason) when a shard did not complete; None when all did. A shard that recorded no end (`None`, or
    still `running`) is explained by the scheduler's record of its task (`accounts`) when there is one."""
    accounts = accounts or {}
    ended: list[tuple[int, str, str]] = []  # shard, status, why
    for i, o in enumerate(outcomes):
        if o is not None and o.get("status") == "completed":
            continue
        if o is not None and o.get("status") != "running":
            ended.append(
                (i, str(o.get("status")), f"(job {o.get('job_id')}): {o.get('status')}: {o.get('reason')}")
            )
        elif i in accounts and accounts[i].status != "completed":
            what = "left no record" if o is None else "ended before it recorded how"
            ended.append((i, str(accounts[i].status), f"{what}: {accounts[i].explain()}; see {array_log}"))
        else:
            ended.append(
                (
                    i,
                    "failed",
                    f"ended without recording how (killed, out of memory or a lost node): see {array_log}",
                )
            )
    if not ended:
        return None
    n = len(outcomes)
    status = worst(s for _, s, _ in ended)
    i, _, why = next(e for e in ended if e[1] == status)
    more = len(ended) - 1
    return status, f"shard {i} of {n} {why}" + (f"; {more} more shard(s) did not complete" if more else "")


def array_end(
    workdir: Path, stage: str, shards: int
) -> tuple[list[dict[str, Any] | None], str | None, tuple[str, str] | None]:
    """How a stage's job array ended, for the job after it: the tasks' outcomes, the array's id, and (status,
    reason) when a task did not complete (`not_completed`, with the scheduler's records of the silent tasks)."""
    outcomes = shard_outcomes(workdir, shards, stage)
    array = array_job(workdir, stage, outcomes)
    log = workdir / "logs" / f"slurm-{stage}-{array or '?'}_<shard>.out"
    return outcomes, array, not_completed(outcomes, str(log), task_accounts(array, outcomes))


def _index(path: Path) -> dict[str, tuple[int, int]]:
    """Row id → (offset, length) of its line: the merge copies lines without holding a shard's rows in memory."""
    found: dict[str, tuple[int, int]] = {}
    if path.is_file():
        with path.open("rb") as handle:
            offset = 0
            for number, line in enumerate(handle, 1):
                if line.strip():
                    row = parse_json(line, str(path), expect=dict, line=number)
                    found[str(row["id"])] = (offset, len(line))
                offset += len(line)
    return found


def _copy(
    sources: Sequence[Path], where: dict[str, tuple[int, int, int]], order: Iterable[str]
) -> Iterator[bytes]:
    """The lines of `order`'s ids, each read from its shard file (`where`: id → shard, offset, length)."""
    handles = [path.open("rb") if path.is_file() else None for path in sources]
    try:
        for row_id in order:
            if row_id in where:
                shard, offset, length = where[row_id]
                handle = handles[shard]
                assert handle is not None
                handle.seek(offset)
                line = handle.read(length)
                yield line if line.endswith(b"\n") else line + b"\n"
    finally:
        for handle in handles:
            if handle is not None:
                handle.close()


def _write_lines(path: Path, lines: Iterable[bytes]) -> None:
    """Stream into a temporary file beside `path`, then rename: readers never see half a merge."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for line in lines:
                handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def merge(plan: PipelinePlan, shards: int) -> dict[str, Any]:
    """Account for every row over the shards and write the stage's outputs; the merged counts. UserError when a
    row is missing, twice, or the shards disagree."""

    workdir = plan.workdir
    chat = plan.context.inputs.get("chat")
    if chat is None:
        raise UserError("regen reads chat rows and none are configured", field="data.chat")
    rows = read_rows(chat, plan.config.data.max_rows)
    ok_lines: dict[str, tuple[int, int, int]] = {}  # id → shard, offset, length
    error_lines: dict[str, tuple[int, int, int]] = {}
    instances: list[dict[str, Any]] = []
    sampling = None
    for i in range(shards):
        folder = output_dir(workdir, i)
        ok, errors, missing = account(shard_rows(rows, i, shards), folder)
        if missing:
            raise UserError(
                f"shard {i}: {len(missing)} row(s) have neither a reply nor an error (e.g. {missing[0]!r})",
                source=str(folder),
                fix="resubmit; the shard resumes",
            )
        lines = _index(folder / "rows.jsonl")
        ok_lines.update((k, (i, *lines[k])) for k in ok)
        errs = _index(folder / "errors.jsonl")
        error_lines.update((k, (i, *errs[k])) for k in errors)
        summary = read_json(folder / "summary.json")
        if sampling is None:
            sampling = summary["sampling"]
        elif summary["sampling"] != sampling:
            raise UserError(
                f"shard {i} used other sampling settings than shard 0",
                source=str(folder),
                fix="resubmit the stage with --force",
            )
        base = len(instances)
        instances += [{**inst, "index": base + j} for j, inst in enumerate(summary["instances"])]
    out = workdir / STAGE
    out.mkdir(parents=True, exist_ok=True)
    folders = [output_dir(workdir, i) for i in range(shards)]
    order = [r.id for r in rows]
    _write_lines(out / "rows.jsonl", _copy([f / "rows.jsonl" for f in folders], ok_lines, order))
    _write_lines(out / "errors.jsonl", _copy([f / "errors.jsonl" for f in folders], error_lines, order))
    summary = {
        "schema_version": 1,
        "input": len(rows),
        "ok": len(ok_lines),
        "errors": len(error_lines),
        "missing": [],
        "instances": instances,
        "sampling": sampling,
    }
    check(summary, "stage-regen", str(out / "summary.json"))
    atomic_write_json(out / "summary.json", summary)
    if not ok_lines:
        raise UserError(f"every row failed; see {out / 'errors.jsonl'}", fix="read the server logs in logs/")
    return {"input": len(rows), "ok": len(ok_lines), "errors": len(error_lines), "shards": shards}


def merged_outcome(plan: PipelinePlan, sp: StagePlan, shards: int, job_id: str | None) -> Outcome:
    """The merge job's step: the shards' outcomes checked, their files merged, the result file written for the
    stage record (versions of shard 0's image, counts summed)."""
    started = time.monotonic()
    workdir = plan.workdir
    outcomes, array, failed = array_end(workdir, STAGE, shards)
    if failed:
        status, reason = failed
        return Outcome(sp.stage.name, status, None, time.monotonic() - started, reason, None)
    try:
        counts = merge(plan, shards)
    except UserError as exc:
        return Outcome(sp.stage.name, "failed", None, time.monotonic() - started, exc.render(), None)
    results = [read_json(p) for p in (result_path(workdir, i) for i in range(shards)) if p.is_file()]
    for key in ("retries", "resumed"):
        counts[key] = sum(int((r.get("counts") or {}).get(key, 0)) for r in results)
    seconds = max(
        float(o.get("seconds", 0)) for o in outcomes if o
    )  # the longest shard: the array's wall time
    save_result(
        workdir / "stages" / f"{STAGE}.result.json",
        {
            "schema_version": RESULT_SCHEMA_VERSION,
            "stage": STAGE,
            "exit_code": 0,
            "seconds": round(seconds, 3),
            "versions": dict((results[0].get("versions") or {}) if results else {}),
            "counts": counts,
            "notes": [
                f"ran as Slurm job array {array or '?'} of {shards} shard(s) (rows k with k mod {shards} == shard), "
                f"each the argv above with --shard/--shards and its own files; merged by job {job_id}"
            ],
        },
    )
    return Outcome(sp.stage.name, "completed", 0, seconds + time.monotonic() - started, None, None)


# --- hsextract's check job --------------------------------------------------------------------------------------


def check_step(sp: StagePlan, ctx: StageContext) -> Step:
    """The check job's step: `hsextract-check` in the stage's image, on no GPU."""
    return replace(
        sp.step,
        name=check_name(sp.stage.name),
        argv=tuple(hsextract.check_argv(ctx)),
        gpus=0,
        ipc_host=False,
        network=False,
    )


def checked_outcome(
    plan: PipelinePlan,
    sp: StagePlan,
    runtime: Runtime,
    shards: int,
    job_id: str | None,
    run: Any = None,
    ctx: Context | None = None,
) -> Outcome:
    """The check job's step: the shards' outcomes checked, then the whole output (`check_step`, through the
    runtime: `run`, default `runtime.run`), which writes the stage's summary and result file; the result gains
    the shards' counts and a note on the array."""
    started = time.monotonic()
    workdir, stage = plan.workdir, sp.stage.name
    outcomes, array, failed = array_end(workdir, stage, shards)
    if failed:
        status, reason = failed
        return Outcome(stage, status, None, time.monotonic() - started, reason, None)
    ctx = ctx or Context(run_dir=workdir, run_id=workdir.name)
    outcome = (run or runtime.run)(check_step(sp, plan.context), ctx)
    seconds = max(float(o.get("seconds", 0)) for o in outcomes if o)  # the longest task: the array's time
    if not outcome.ok:
        return replace(outcome, step=stage, seconds=seconds + outcome.seconds)
    final = workdir / "stages" / f"{stage}.result.json"
    result = read_json(final) if final.is_file() else {}
    paths = [result_path(workdir, i, stage) for i in range(shards)]
    shard_results = [read_json(p) for p in paths if p.is_file()]
    counts = dict(result.get("counts") or {})
    for key in ("written", "skipped"):
        found = [r["counts"][key] for r in shard_results if key in (r.get("counts") or {})]
        if found:
            counts[key] = sum(int(v) for v in found)
    counts["shards"] = shards
    save_result(
        final,
        {
            **result,
            "seconds": round(seconds + outcome.seconds, 3),
            "counts": counts,
            "notes": [
                *(result.get("notes") or []),
                f"ran as Slurm job array {array or '?'} of {shards} task(s) (rows split by --world-size/--rank, "
                f"speculators' contiguous blocks), each the argv above restricted to its blocks with its own "
                f"--result/--summary/--commands/--logs; whole output checked by job {job_id}",
            ],
        },
    )
    return replace(outcome, step=stage, seconds=seconds + outcome.seconds)
