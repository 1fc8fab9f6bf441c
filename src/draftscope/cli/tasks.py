"""The host command line: invoke tasks. Thin by design — each task parses options, calls the library, prints.

`tasks.py` at the top of the checkout re-exports this namespace, so `invoke plan` works there; the
`draftscope` console script runs the same tasks anywhere the package is installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from invoke import Collection, Exit, Program, task

from draftscope import __version__
from draftscope.cli.handler import user_errors
from draftscope.core.errors import UserError

DEFAULT_EXPERIMENTS = ("transformers-baseline", "vllm-int4-dflash2", "vllm-int4-dflash2-prefix")


@task(
    iterable=["experiment", "opts"],
    help={
        "experiment": "experiment preset to plan (repeatable; default: the baseline, INT4 + DFlash2, and prefix)",
        "prompts": "prompt file (JSON, see schemas/prompts.schema.json)",
        "opts": "override a config field, key=value (repeatable), e.g. repeats=3",
        "json": "print the plan as JSON",
    },
)
@user_errors
def plan(c, experiment=None, prompts=None, opts=None, json=False):
    """Print the experiment plan: backends, images, model + revision, prompts + hash, repeats, limits, downloads."""
    from draftscope.bench.plan import plan_benchmark
    from draftscope.cli.render import plan_lines
    from draftscope.core.presets import load_experiment
    from draftscope.ops.images import image_reference

    names = experiment or list(DEFAULT_EXPERIMENTS)
    plans = [plan_benchmark(load_experiment(n, {"prompts": prompts}, opts or ())) for n in names]
    if json:
        _print_json([p.to_dict() for p in plans])
        return
    for i, p in enumerate(plans):
        if i:
            print()
        print("\n".join(plan_lines(p, image_reference)))


@task(help={"show": "print one preset (model or experiment), fully resolved, as YAML"})
@user_errors
def presets(c, show=None):
    """List the model and experiment presets, or show one resolved."""
    from draftscope.cli.render import console, preset_table, yaml_text
    from draftscope.core import presets as P

    if show:
        if show in P.model_preset_names():
            print(yaml_text(P.load_model_preset(show)), end="")
        else:
            print(yaml_text(P.load_experiment(show)), end="")
        return
    out = console()
    models = [P.load_model_preset(n) for n in P.model_preset_names()]
    experiments = [P.load_experiment(n) for n in P.experiment_preset_names()]
    for table in preset_table(models, experiments):
        out.print(table)


@task(help={"run_dir": "the run directory (or pipeline workdir) to check"})
@user_errors
def validate(c, run_dir):
    """Validate every artifact of a run directory, or of a pipeline workdir, against its schema (a workdir's
    recorded outputs re-hashed too): one verdict line per file."""
    from draftscope.ops.validate import validate_path

    report = validate_path(run_dir)
    for verdict in report.verdicts:
        print(verdict.line())
    line = _liveness_line(run_dir)
    if line:
        print(line)
    if not report.ok:
        failed = sum(not v.ok for v in report.verdicts)
        raise Exit(f"{run_dir}: {failed} of {len(report.verdicts)} file(s) failed validation", code=1)
    print(f"{run_dir}: all {len(report.verdicts)} file(s) valid")


def _liveness_line(run_dir: str) -> str | None:
    """A line about an unfinished run's supervisor, for `validate`: whether it lives, and how to finish its record."""
    from draftscope.core.rundir import liveness

    try:
        state = liveness(Path(run_dir))
    except (UserError, OSError):
        return None  # no readable manifest: the verdicts say so
    if state.state == "finished":
        return None
    hint = f"; `invoke recover {run_dir}` finishes its record" if state.state == "gone" else ""
    return f"note: {state.describe()}{hint}"


@task(help={"run_dir": "the run directory whose supervisor was killed", "force": "skip the safety checks"})
@user_errors
def recover(c, run_dir, force=False):
    """Finish the record of a run whose supervisor was killed outright (SIGKILL, the OOM killer, a crash): stop
    what its step left running, cut a torn last record, write the summary from the records kept and the status
    `interrupted` with the reason. A live or finished run is refused."""
    from draftscope.bench.recover import recover as finish_run

    manifest = finish_run(Path(run_dir), force=force)
    print(f"{run_dir}: {manifest['status']}: {manifest['reason']}")


BACKEND_EXPERIMENTS = {"transformers": "transformers-baseline", "vllm": "vllm-int4-dflash2"}


@task(
    iterable=["opts"],
    help={
        "backend": "transformers or vllm",
        "experiment": "experiment preset to start from (default: by backend)",
        "int4_dflash": "vLLM: the INT4 target with the DFlash2 draft",
        "experimental_prefix": "vLLM INT4 + DFlash2: the experimental prefix-conditioned head",
        "preset": "model preset (invoke presets)",
        "prompts": "prompt file (JSON)",
        "output": "run directory to create (must not exist)",
        "max_seconds": "hard wall-clock limit, loading, compilation and warm-ups included",
        "repeats": "repeats of every prompt",
        "warmups": "warm-up generations before timing",
        "memory_fraction": "GPU memory cap (torch allocator fraction / vLLM gpu_memory_utilization)",
        "model": "custom target OWNER/NAME (needs --revision)",
        "revision": "full 40-character commit SHA of --model",
        "draft": "draft OWNER/NAME (needs --draft-revision), or 'tiny' for the kit-built draft",
        "draft_revision": "full 40-character commit SHA of --draft",
        "draft_tokens": "tokens the draft proposes per verification step",
        "fixed_tokens": "generate exactly N tokens (EOS suppressed) for timing studies",
        "max_new_tokens": "maximum tokens per request",
        "device": "cuda or cpu (cpu is an explicit choice for the tiny preset, never a fallback)",
        "runtime": "docker, podman or local",
        "opts": "override any config field, key=value (repeatable)",
        "dry_run": "print the container command(s) and stop; creates nothing",
        "head": "Transformers + draft: the target head, dense (default), rowwise or prefix (certified, exact)",
        "head_shadow": "with --head: also run the dense head every step and count disagreements (must be 0)",
        "capture_head": "record the first N verification calls for invoke head-study",
        "executor": "local (default): run the supervisor here; slurm: submit it as one Slurm batch job (sbatch) "
        "that runs the same supervisor on a compute node, and follow it (Ctrl-C cancels it); the run directory "
        "must be on storage the nodes share",
        "partition": "slurm: the partition",
        "account": "slurm: the account to charge",
        "qos": "slurm: the quality of service",
    },
)
@user_errors
def benchmark(
    c,
    backend="transformers",
    experiment=None,
    int4_dflash=False,
    experimental_prefix=False,
    preset=None,
    prompts=None,
    output=None,
    max_seconds=None,
    repeats=None,
    warmups=None,
    memory_fraction=None,
    model=None,
    revision=None,
    draft=None,
    draft_revision=None,
    draft_tokens=None,
    fixed_tokens=None,
    max_new_tokens=None,
    device=None,
    runtime=None,
    opts=None,
    dry_run=False,
    head=None,
    head_shadow=False,
    capture_head=None,
    executor="local",
    partition=None,
    account=None,
    qos=None,
):
    """Run a bounded, auditable greedy benchmark in its image (or locally) into a new run directory; with
    --executor slurm, as a Slurm job."""
    from pathlib import Path

    from draftscope.bench import supervisor
    from draftscope.bench.plan import plan_benchmark
    from draftscope.core.presets import load_experiment
    from draftscope.execute.slurm.options import check_names, executor_flags
    from draftscope.runtime import get_runtime

    slurm = executor_flags(executor, partition=partition, account=account, qos=qos)
    check_names(slurm)

    name = experiment or BACKEND_EXPERIMENTS.get(backend)
    if name is None:
        raise UserError(f"unknown backend '{backend}'", field="--backend", fix="choose transformers or vllm")
    overrides = {
        "backend": backend,
        "model_preset": preset,
        "prompts": prompts,
        "repeats": _int(repeats, "--repeats"),
        "warmups": _int(warmups, "--warmups"),
        "max_seconds": _num(max_seconds, "--max-seconds"),
        "memory_fraction": _num(memory_fraction, "--memory-fraction"),
        "model": model,
        "revision": revision,
        "draft": draft,
        "draft_revision": draft_revision,
        "draft_tokens": _int(draft_tokens, "--draft-tokens"),
        "fixed_tokens": _int(fixed_tokens, "--fixed-tokens"),
        "max_new_tokens": _int(max_new_tokens, "--max-new-tokens"),
        "device": device,
        "runtime": runtime,
        "int4_dflash": True if int4_dflash else None,
        "experimental_prefix": True if experimental_prefix else None,
    }
    head_overrides = {
        "policy": head,
        "shadow": True if head_shadow else None,
        "capture": _int(capture_head, "--capture-head"),
    }
    if any(v is not None for v in head_overrides.values()):
        overrides["head"] = {k: v for k, v in head_overrides.items() if v is not None}
    config = load_experiment(name, overrides, opts or ())
    if dry_run:
        target = Path(output or f"runs/{config.name}-<timestamp>")
        if executor == "slurm":
            from draftscope.bench import slurm as slurm_benchmark

            job = slurm_benchmark.build(config, target, flags=slurm, python=sys.executable)
            print("\n".join(slurm_benchmark.dry_run_lines(job)))
            return
        plan = plan_benchmark(config, str(target))
        print("\n".join(supervisor.dry_run_lines(plan, get_runtime(config.runtime), target)))
        return
    if output is None:
        raise UserError("no run directory given", field="--output", fix="add --output runs/NAME (a new path)")
    if executor == "slurm":
        from draftscope.bench import slurm as slurm_benchmark

        status, reason = slurm_benchmark.run(config, Path(output), flags=slurm, argv=sys.argv)
    else:
        manifest = supervisor.run_benchmark(config, Path(output), argv=sys.argv)
        status, reason = manifest["status"], manifest.get("reason")
    print(f"{output}: {status}" + (f" ({reason})" if reason else ""))
    if status != "completed":
        raise Exit(code=1)


def _int(value, flag):
    return None if value is None else _parse(int, value, flag, "an integer")


def _num(value, flag):
    return None if value is None else _parse(float, value, flag, "a number")


def _parse(kind, value, flag, what):
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"expected {what}", field=flag, value=value) from None


@task(help={"tokens": "tokens per request", "rounds": "interleaved rounds over the prompts"})
@user_errors
def bench_overhead(c, tokens=64, rounds=5):
    """Timing instrumentation vs a bare greedy loop (and model.generate) on the tiny model, as ratios."""
    from draftscope import tiny
    from draftscope.bench.overhead import measure, report_lines
    from draftscope.bench.plan import load_prompts
    from draftscope.core.jsonio import read_json

    tokenizer, model = tiny.load_tokenizer(), tiny.load_target(device="cpu")
    prompts = read_json(load_prompts("examples/prompts.json").path)["prompts"][:4]
    encoded = []
    for p in prompts:
        out = tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
        encoded.append(list(getattr(out, "input_ids", out)))
    print("\n".join(report_lines(measure(model, encoded, tokens=int(tokens), rounds=int(rounds)))))


@task(help={"json": "print the report as JSON"})
@user_errors
def doctor(c, json=False):
    """Report the host: NVIDIA GPUs and dtype policy, driver/CUDA, memory, disk, container engine, kit images."""
    from draftscope.ops import doctor as D

    report = D.collect()
    if json:
        _print_json(report)
    else:
        print("\n".join(D.render(report)))


@task
def version(c):
    """Print the kit's version (and git commit when run from a checkout)."""
    from draftscope.core.provenance import kit_info

    print(f"draftscope {version_text(kit_info())}")


def version_text(info: dict[str, Any]) -> str:
    """`0.1.0`, or `0.1.0 (abcdef123456+dirty)` from a checkout."""
    commit = (
        f" ({info['git_commit'][:12]}{'+dirty' if info['git_dirty'] else ''})" if info["git_commit"] else ""
    )
    return f"{info['version']}{commit}"


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    print()


def _namespace() -> Collection:
    from draftscope.cli.analysis import ANALYSIS_TASKS, ns_evidence
    from draftscope.cli.tiny import ns_tiny

    root = Collection(
        plan, presets, benchmark, bench_overhead, validate, recover, doctor, version, *ANALYSIS_TASKS
    )
    root.add_collection(ns_evidence, name="evidence")
    root.add_collection(ns_tiny, name="tiny")
    from draftscope.cli.demo import DEMO_TASKS
    from draftscope.cli.head import HEAD_TASKS
    from draftscope.cli.images import ns_images
    from draftscope.cli.pipeline import PIPELINE_TASKS

    root.add_collection(ns_images, name="images")
    for t in (*PIPELINE_TASKS, *HEAD_TASKS, *DEMO_TASKS):
        root.add_task(t)
    from draftscope.cli.reliability import RELIABILITY_TASKS

    for t in RELIABILITY_TASKS:
        root.add_task(t)
    from draftscope.cli.share import SHARE_TASKS

    for t in SHARE_TASKS:
        root.add_task(t)
    return root


ns = _namespace()

# Tasks whose first positional argument takes several values (`invoke analyze A B --report R`). invoke's parser
# gives a positional one value and reads the next word as a task name; these values are joined with commas first.
VARIADIC = ("analyze",)


def join_variadic(argv: list[str], namespace: Collection = ns) -> list[str]:
    """Rewrite `analyze A B [--flag V] C` as `analyze A,B,C [--flag V]`; everything else passes unchanged."""
    tasks = set(namespace.task_names) | {a for aliases in namespace.task_names.values() for a in aliases}
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        out.append(word)
        i += 1
        if word not in VARIADIC:
            continue
        takes_value = {
            (f"--{n}" if len(n) > 1 else f"-{n}").replace("_", "-")
            for a in namespace[word].get_arguments()
            if a.takes_value
            for n in a.names
        }
        values, flags = [], []
        while i < len(argv) and argv[i] not in tasks:
            if argv[i].startswith("-"):
                flags.append(argv[i])
                if argv[i] in takes_value and i + 1 < len(argv):
                    flags.append(argv[i + 1])
                    i += 1
            else:
                values.append(argv[i])
            i += 1
        if values:
            out.append(",".join(values))
        out += flags
    return out


def main() -> None:
    """The `draftscope` console script: the same tasks, usable outside a checkout."""
    version_flag = "--version" in sys.argv[1:2] or "-V" in sys.argv[1:2]
    if version_flag:  # the commit too, when run from a checkout (kit_info runs git only then)
        from draftscope.core.provenance import kit_info

        shown = version_text(kit_info())
    else:
        shown = __version__
    program = Program(namespace=ns, version=shown, name="draftscope", binary="draftscope")
    program.run([sys.argv[0], *join_variadic(sys.argv[1:])])
