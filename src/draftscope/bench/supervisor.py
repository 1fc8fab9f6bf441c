"""The benchmark supervisor (host side): run directory, manifest, the worker in its image under a hard limit,
then the summary and the final status. Imports no torch.

Lifecycle: preflight (pins, image, engine) → create the run directory (exclusive) → `running` → each step of the
plan through the runtime → summary from whatever records exist → `completed` only if every step succeeded and
every artifact validates; otherwise `timed_out` / `interrupted` / `failed` with the reason, records kept.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from draftscope.bench.summary import read_records, summarize
from draftscope.bench.worker import FAILPOINT
from draftscope.config import to_dict
from draftscope.errors import UserError
from draftscope.jsonio import read_json
from draftscope.plan import Plan, plan_benchmark
from draftscope.presets import ExperimentConfig
from draftscope.rundir import RECORDS, InputFile, RunDir
from draftscope.runtime import ContainerRuntime, Context, Outcome, Runtime, get_runtime

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
        lines.append(_join(argv))
    if plan.experiment.backend == "vllm":
        from draftscope.bench.backends.vllm import engine_args

        args = engine_args(plan.experiment, plan.preset, capability=None, require_pins=False)
        lines.append(
            "# vLLM engine arguments the worker passes (from the frozen config; dtype by the GPU found):"
        )
        lines.append("# " + json.dumps(args, sort_keys=True))
    return lines


def _join(argv: list[str]) -> str:
    from draftscope.provenance import shell_join

    return shell_join(argv)


def preflight(plan: Plan, runtime: Runtime) -> None:
    """Everything that can be refused before a run directory exists: no partial state on bad input."""
    for download in plan.downloads:
        if download.revision is None:
            raise UserError(
                f"{download.role} {download.repo} has no pinned revision",
                field="revision",
                fix="pin the full 40-character commit SHA in the preset or pass --revision/--draft-revision",
            )
    if isinstance(runtime, ContainerRuntime):
        for image in sorted({s.image for s in plan.steps}):
            runtime.image_facts(image)  # raises a UserError naming the image and how to build it


def run_benchmark(
    config: ExperimentConfig,
    output: Path,
    *,
    argv: list[str],
    say: Printer = print,
    kind: str = "benchmark",
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one benchmark into a new run directory; `kind="reproduce"` (with `notes`) marks a reproduction."""
    plan = plan_benchmark(config, str(output))
    runtime = get_runtime(config.runtime)
    preflight(plan, runtime)
    from draftscope.__main__ import versions

    run = RunDir.create(
        output,
        kind=kind,
        config=to_dict(config),
        argv=argv,
        inputs=[InputFile("prompts", Path(plan.prompts.path))],
        software={"host": versions()},
    )
    ctx = context_for(output)
    (run.path / RECORDS).touch()  # exists from the start: a run killed before its first record still has one
    try:
        images = _image_facts(plan, runtime, ctx)
        run.update(images=images)
        for text in notes:
            run.note(text)
        if os.environ.get(FAILPOINT):
            run.note(f"fault injection was active: {FAILPOINT}={os.environ[FAILPOINT]}")
        run.set_status("running")
        outcome = _run_steps(plan, runtime, ctx, run, say)
    except KeyboardInterrupt:
        outcome = Outcome("benchmark", "interrupted", None, 0.0, "interrupted by the user (Ctrl-C)", None)
    return _finish(run, plan, outcome)


def _image_facts(plan: Plan, runtime: Runtime, ctx: Context) -> list[dict[str, Any]]:
    facts = []
    for step in plan.steps:
        if isinstance(runtime, ContainerRuntime):
            info = runtime.image_facts(step.image)
            facts.append({"step": step.name, "runtime": runtime.name, **info})
        else:
            facts.append(
                {"step": step.name, "runtime": "local", "reference": None, "id": None, "repo_digests": []}
            )
    return facts


def _run_steps(plan: Plan, runtime: Runtime, ctx: Context, run: RunDir, say: Printer) -> Outcome:
    steps_state = []
    outcome: Outcome | None = None
    for step in plan.steps:
        watcher = _Progress(run.path / RECORDS, plan.prompts.count * plan.experiment.repeats, say)
        if step.name == "benchmark":
            watcher.start()
        try:
            outcome = runtime.run(step, ctx)
        finally:
            watcher.stop()
        steps_state.append(
            {
                "name": step.name,
                "status": outcome.status,
                "exit_code": outcome.exit_code,
                "seconds": round(outcome.seconds, 3),
                "argv": runtime.argv(step, ctx),  # exactly what ran (and what --dry-run prints)
            }
        )
        run.update(steps=steps_state)
        if not outcome.ok:
            break
    assert outcome is not None
    return outcome


def _finish(run: RunDir, plan: Plan, outcome: Outcome) -> dict[str, Any]:
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
            from draftscope.head.vllm_switch import read_status

            software["prefix_head"] = read_status(run.path)
        run.update(hardware=facts.get("hardware"), software=software)
    records = read_records(run.path)
    prompt_ids = [p["id"] for p in read_json(Path(plan.prompts.path))["prompts"]]
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
    """Name out-of-memory as the cause when the step's log shows it (vLLM's engine process reports it early in the
    log, before the lines the generic reason quotes)."""
    if outcome.status != "failed" or outcome.log is None or not outcome.log.exists():
        return outcome.reason
    markers: tuple[str, ...] = ("out of memory", "OutOfMemoryError")
    if plan.experiment.backend == "vllm":
        from draftscope.bench.backends.vllm import OOM_MARKERS

        markers += tuple(OOM_MARKERS)
    text = outcome.log.read_text(encoding="utf-8", errors="replace")
    if any(m in text for m in markers):
        return f"out of memory (step '{outcome.step}', exit code {outcome.exit_code}); see {outcome.log.name}"
    return outcome.reason


class _Progress:
    """Reports each finished record while the worker runs (a line per record; the file is the source of truth)."""

    def __init__(self, path: Path, total: int, say: Printer, interval: float = 0.5) -> None:
        self.path, self.total, self.say, self.interval = path, total, say, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._seen = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=5)
            self._report()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._report()

    def _report(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return
        for line in lines[self._seen :]:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                break  # being written; next round
            self._seen += 1
            dec = f", decode {r['decode_tok_s']:.1f} tok/s" if r.get("decode_tok_s") else ""
            acc = r.get("acceptance_lengths")
            acc_s = f", {sum(acc) / len(acc):.2f} tokens/step" if acc else ""
            self.say(
                f"  [{self._seen}/{self.total}] {r['prompt_id']} repeat {r['repeat']}: "
                f"{r['generated_tokens']} tokens, {r['request_tok_s']:.1f} tok/s{dec}{acc_s}"
            )
