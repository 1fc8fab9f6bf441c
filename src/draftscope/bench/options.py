"""`invoke benchmark`'s options turned into what they ask for: the experiment config (`experiment_config`), and the
run — its dry-run lines or the run itself, here or as one Slurm job (`dry_run_lines`, `run`).

The command line only parses and prints; every rule about these options lives here, and each error names the flag
as typed (`--max-seconds`), the value and the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from draftscope.bench import backends, supervisor
from draftscope.bench import slurm as slurm_benchmark
from draftscope.bench.plan import plan_benchmark, prompt_overrides
from draftscope.core.errors import Interrupted, UserError
from draftscope.core.presets import ExperimentConfig, load_experiment
from draftscope.execute.slurm.options import check_names, executor_flags
from draftscope.runtime import get_runtime
from draftscope.runtime.base import stop_signals

# The experiment a bare `--backend` starts from.
Number = str | int | float | None  # invoke hands over an option without a typed default as text


def slurm_flags(executor: str, **flags: str | None) -> dict[str, Any]:
    """The Slurm flags given (`--partition`, `--account`, `--qos`), checked: known executor, names by the rule."""
    given = executor_flags(executor, **flags)
    check_names(given)
    return given


def experiment_config(
    *,
    backend: str | None = None,
    experiment: str | None = None,
    int4_dflash: bool = False,
    experimental_prefix: bool = False,
    preset: str | None = None,
    prompts: str | None = None,
    dataset: str | None = None,
    max_prompts: Number = None,
    max_seconds: Number = None,
    repeats: Number = None,
    warmups: Number = None,
    memory_fraction: Number = None,
    model: str | None = None,
    revision: str | None = None,
    draft: str | None = None,
    draft_revision: str | None = None,
    draft_tokens: Number = None,
    fixed_tokens: Number = None,
    max_new_tokens: Number = None,
    device: str | None = None,
    runtime: str | None = None,
    opts: Iterable[str] = (),
    head: str | None = None,
    head_shadow: bool = False,
    capture_head: Number = None,
    dtype: str | None = None,
) -> ExperimentConfig:
    """The experiment preset (`experiment`, else the backend's) with the options given laid over it, then the
    `key=value` overrides of `opts`; an option left out (None, False) keeps the preset's value."""
    # An unknown backend lists the valid ones; `--device` may pick the backend's preset for that device.
    # No --backend: the experiment preset's own (so `-e vllm-int4-dflash2` alone is the vLLM experiment), else
    # the Transformers backend's preset.
    name = experiment or backends.get(backend or "transformers").experiment_for(device)
    overrides: dict[str, Any] = {
        "backend": backend,
        "model_preset": preset,
        **prompt_overrides(prompts, dataset, max_prompts),
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
        "dtype": dtype,
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
    return load_experiment(name, overrides, opts or ())


def dry_run_lines(
    config: ExperimentConfig,
    output: str | None,
    *,
    executor: str = "local",
    slurm: Mapping[str, Any] | None = None,
) -> list[str]:
    """What `--dry-run` prints: the container command(s), or the Slurm job; nothing is created."""
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


def _int(value: Number, flag: str) -> int | None:
    return None if value is None else _parse(int, value, flag, "an integer")


def _num(value: Number, flag: str) -> float | None:
    return None if value is None else _parse(float, value, flag, "a number")


def _parse(kind: type, value: Number, flag: str, what: str) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"expected {what}", field=flag, value=value) from None
