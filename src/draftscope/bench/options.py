"""`invoke benchmark`'s options, each written once (`BENCHMARK`, an `OptionTable`: flag, config field, type, help,
bounds), and what they ask for: the experiment config (`experiment_config`), and the run — its dry-run lines or the
run itself, here or as one job of the Slurm launcher (`dry_run_lines`, `run`).

The command line only parses and prints; its parameters, help and parsing are made from the table, and every rule
about these options lives here. Each error names the flag as typed (`--max-seconds`), the value and the fix.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from draftscope.bench import backends
from draftscope.bench.plan import plan_benchmark, prompt_overrides
from draftscope.core.errors import Interrupted, UserError
from draftscope.core.options import SHARED, Option, OptionTable
from draftscope.core.outputs import check_output_path
from draftscope.core.presets import ExperimentConfig, load_experiment
from draftscope.execute.options import LAUNCHER, check_names, executor_flags

_NAME = {"$ref": "common.schema.json#/$defs/name"}
_REPO = {"$ref": "common.schema.json#/$defs/hub_repo"}
_SHA = {"oneOf": [{"$ref": "common.schema.json#/$defs/commit_sha"}, {"type": "null"}]}

# The experiment a run starts from: --experiment, else the backend's (by --device), else the Transformers one's.
DEFAULT_BACKEND = "transformers"

BENCHMARK = OptionTable.of(
    Option(
        "backend",
        "the benchmark backend",
        field="backend",
        choices=lambda: tuple(backends.BACKENDS),
        schema={
            "description": "a benchmark backend, e.g. transformers (planning refuses a name the kit does not "
            "register and lists the valid ones)",
            "type": "string",
            "pattern": "^[a-z][a-z0-9-]*$",
        },
    ),
    Option(
        "experiment", "experiment preset to start from (default: the backend's; invoke presets lists them)"
    ),
    Option("int4_dflash", "vLLM: the INT4 target with the DFlash2 draft", kind=bool, field="int4_dflash"),
    Option(
        "experimental_prefix",
        "vLLM: the experimental prefix-conditioned head (INT4 + DFlash2 on a GPU; in the tiny CPU engine it runs "
        "its CPU path in vLLM's V1 runner and records its status)",
        kind=bool,
        field="experimental_prefix",
    ),
    SHARED.only("preset"),
    Option(
        "prompts",
        "prompt file (JSON, schemas/prompts.schema.json)",
        field="prompts",
        metavar="FILE",
        fix="give the path of a prompt file (JSON, schemas/prompts.schema.json), e.g. --prompts examples/prompts.json",
    ),
    Option(
        "dataset",
        "a prompt set the kit ships, instead of --prompts (invoke datasets lists them)",
        field="dataset",
        schema={"oneOf": [_NAME, {"type": "null"}]},
        fix="give a shipped set's name, e.g. --dataset mt-bench (invoke datasets lists them)",
    ),
    Option(
        "max_prompts",
        "only the first N prompts of the file, in file order (recorded in the config)",
        kind=int,
        field="max_prompts",
        minimum=1,
        maximum=1_000_000,
        nullable=True,
        fix="give a whole number of prompts, at least 1, e.g. --max-prompts 3",
    ),
    Option("output", "run directory to create (must not exist)", metavar="DIR"),
    Option(
        "max_seconds",
        "hard wall-clock limit in seconds, loading, compilation and warm-ups included",
        kind=float,
        field="max_seconds",
        above=0,
        maximum=604_800,
        fix="give the wall-clock limit in seconds (> 0, at most 604800: a week), e.g. --max-seconds 600",
    ),
    Option("repeats", "repeats of every prompt", kind=int, field="repeats", minimum=1, maximum=1000),
    Option("warmups", "warm-up generations before timing", kind=int, field="warmups", minimum=0, maximum=100),
    Option(
        "memory_fraction",
        "GPU memory cap (torch allocator fraction / vLLM gpu_memory_utilization)",
        kind=float,
        field="memory_fraction",
        above=0,
        maximum=1,
        fix="give a fraction of GPU memory in (0, 1], e.g. --memory-fraction 0.6",
    ),
    Option(
        "model",
        "custom target OWNER/NAME (needs --revision)",
        field="model",
        schema={"oneOf": [_REPO, {"type": "null"}]},
    ),
    Option("revision", "full 40-character commit SHA of --model", field="revision", schema=_SHA),
    Option(
        "draft",
        "draft OWNER/NAME (needs --draft-revision), or 'tiny' for the kit-built draft",
        field="draft",
        schema={"oneOf": [_REPO, {"const": "tiny"}, {"type": "null"}]},
        fix="give the draft as OWNER/NAME with --draft-revision SHA, 'tiny' for the kit-built draft, or null for "
        "none",
    ),
    Option("draft_revision", "full 40-character commit SHA of --draft", field="draft_revision", schema=_SHA),
    Option(
        "draft_tokens",
        "tokens the draft proposes per verification step",
        kind=int,
        field="draft_tokens",
        minimum=1,
        maximum=64,
    ),
    Option(
        "fixed_tokens",
        "generate exactly N tokens (EOS suppressed) for timing studies",
        kind=int,
        field="fixed_tokens",
        minimum=1,
        maximum=1_048_576,
        nullable=True,
    ),
    Option(
        "max_new_tokens",
        "maximum tokens per request",
        kind=int,
        field="max_new_tokens",
        minimum=1,
        maximum=1_048_576,
    ),
    Option(
        "device",
        "cpu is an explicit choice for the tiny preset, never a fallback",
        field="device",
        choices=("cuda", "cpu"),
    ),
    SHARED.only("runtime").changed("runtime", field="runtime", help="where the run's steps run"),
    Option(
        "dtype",
        "auto: bfloat16 on capability >= 8.0, float16 below, float32 on the CPU",
        field="dtype",
        choices=("auto", "bfloat16", "float16", "float32"),
    ),
    Option(
        "head",
        "Transformers + draft: the target head, dense, or the certified (exact) coarse head with the row-wise or "
        "prefix fallback",
        field="head.policy",
        choices=("dense", "rowwise", "prefix"),
    ),
    Option(
        "head_shadow",
        "with --head: also run the dense head every step and count disagreements (must be 0)",
        kind=bool,
        field="head.shadow",
    ),
    Option(
        "capture_head",
        "record the first N verification calls for invoke head-study",
        kind=int,
        field="head.capture",
        minimum=0,
        maximum=100_000,
    ),
    SHARED.only("opts"),
    SHARED.only("dry_run").changed(
        "dry_run", help="print the container command(s) and stop; creates nothing"
    ),
    LAUNCHER.only("executor", "partition", "account", "qos").changed(
        "executor",
        help="local: run the supervisor here; slurm: submit it as one batch job of the Slurm launcher that runs "
        "the same supervisor on a compute node, and follow it (Ctrl-C cancels it); the run directory must be on "
        "storage the nodes share",
    ),
)

# `invoke plan`: the prompt options of a benchmark, and several experiments at once.
PLAN = OptionTable.of(
    BENCHMARK.only("experiment").changed(
        "experiment",
        repeatable=True,
        help="experiment preset to plan (default: the baseline, INT4 + DFlash2, and prefix)",
    ),
    BENCHMARK.only("prompts", "dataset", "max_prompts", "opts"),
    Option("json", "print the plan as JSON", kind=bool),
)

# The options that set the experiment config (the others say where and how the run goes).
CONFIG_OPTIONS = ("backend", "experiment", *(r.name for r in BENCHMARK if r.field), "opts")


def experiment_name(backend: str | None, experiment: str | None, device: str | None) -> str:
    """The preset a run starts from: --experiment; else the backend's for --device (`-e vllm-int4-dflash2` alone
    is the vLLM experiment, with that preset's own backend)."""
    return experiment or backends.get(backend or DEFAULT_BACKEND).experiment_for(device)


def experiment_config(*, opts: Any = (), **given: Any) -> ExperimentConfig:
    """The experiment preset with the options given laid over it, then the `key=value` overrides of `opts`; an
    option left out (None, False) keeps the preset's value. Values are typed text or values (both parsed here)."""
    table = BENCHMARK.only(*given, "opts") if "opts" not in given else BENCHMARK.only(*given)
    values = table.parse({**given, "opts": list(opts or ()) or None})
    return config_from(values)


def config_from(values: Mapping[str, Any]) -> ExperimentConfig:
    """The experiment config of parsed `BENCHMARK` values (`OptionTable.parse`)."""
    name = experiment_name(values.get("backend"), values.get("experiment"), values.get("device"))
    table = BENCHMARK.only(*(n for n in values if n in BENCHMARK and BENCHMARK[n].field))
    overrides = table.overrides(values)
    overrides |= prompt_overrides(values.get("prompts"), values.get("dataset"), values.get("max_prompts"))
    return load_experiment(name, overrides, values.get("opts") or (), flags=BENCHMARK.flags())


def preset_defaults(values: Mapping[str, Any] | None = None) -> tuple[str, ExperimentConfig]:
    """The preset the help's defaults come from (the one a bare `invoke benchmark` starts from) and its config."""
    values = values or {}
    name = experiment_name(values.get("backend"), values.get("experiment"), values.get("device"))
    return name, load_experiment(name)


def slurm_flags(executor: str, **flags: str | None) -> dict[str, Any]:
    """The Slurm flags given (`--partition`, `--account`, `--qos`), checked: known executor, names by the rule."""
    given = executor_flags(executor, **flags)
    check_names(given)
    return given


def dry_run_lines(
    config: ExperimentConfig,
    output: str | None,
    *,
    executor: str = "local",
    slurm: Mapping[str, Any] | None = None,
) -> list[str]:
    """What `--dry-run` prints: the container command(s), or the Slurm launcher's job; nothing is created. A
    given `--output` must be a path a run could create (checked here too, so the dry run says what the run would)."""
    if output is not None:
        check_output_path(Path(output), "--output")
        if os.path.lexists(output):
            raise UserError(
                "the output directory already exists; runs are never overwritten or merged",
                field="--output",
                value=output,
                fix="choose a new --output path",
            )
    # lazy here and in `run`: the supervisor, the runtimes and the Slurm launcher; the tables above are read by
    # the command line on every start (its help and parsing), which starts without them
    from draftscope.bench import batch as slurm_benchmark
    from draftscope.bench import supervisor
    from draftscope.runtime import get_runtime

    target = Path(output or f"runs/{config.name}-<timestamp>")
    if executor == "slurm":
        job = slurm_benchmark.build(config, target, flags=dict(slurm or {}), python=sys.executable)
        return slurm_benchmark.dry_run_lines(job)

    plan = plan_benchmark(config, str(target))
    return supervisor.dry_run_lines(plan, get_runtime(config.runtime), target)


def run(
    config: ExperimentConfig,
    output: str | None,
    *,
    executor: str = "local",
    slurm: Mapping[str, Any] | None = None,
    argv: list[str],
) -> tuple[str, str | None]:
    """Run the benchmark into the new run directory `output`, here or as a Slurm job: (status, reason)."""
    if output is None:
        raise UserError("no run directory given", field="--output", fix="add --output runs/NAME (a new path)")
    from draftscope.bench import batch as slurm_benchmark
    from draftscope.bench import supervisor
    from draftscope.runtime.base import stop_signals

    if executor == "slurm":
        return slurm_benchmark.run(config, Path(output), flags=dict(slurm or {}), argv=argv)

    with stop_signals() as signals:
        try:
            manifest = supervisor.run_benchmark(config, Path(output), argv=argv)
        except KeyboardInterrupt:
            # Before the run directory existed, or while it was made (its creation removes it): nothing is left.
            raise Interrupted(
                signals.code or 130, f"{output}: interrupted before the run started; nothing was created"
            ) from None
    if signals.code is not None:
        raise Interrupted(signals.code, stopped_line(output, manifest))
    return manifest["status"], manifest.get("reason")


def stopped_line(output: str, manifest: Mapping[str, Any]) -> str:
    """The one line a stopped benchmark ends with: what became of its run, and where it is."""
    status, reason = manifest.get("status"), manifest.get("reason")
    if status == "running":
        return f"{output}: left unfinished ({reason}); once nothing of it runs, `invoke recover {output}` finishes it"
    return (
        f"{output}: {status}"
        + (f" ({reason})" if reason else "")
        + "; its records and summary are kept there"
    )
