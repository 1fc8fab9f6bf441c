"""The `pipeline` task: the 8-stage draft-training pipeline, or a dry run of it. Thin: the library plans and runs."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit

from draftscope.cli.command import command
from draftscope.core.outputs import check_output_path
from draftscope.execute.options import executor_flags
from draftscope.pipeline import registry
from draftscope.pipeline.options import PIPELINE
from draftscope.pipeline.options import defaults as pipeline_defaults
from draftscope.runtime import get_runtime


@command(table=PIPELINE, defaults=pipeline_defaults)
def pipeline(c, **values):
    """Train and serve a DFlash / DFlash2 / DSpark draft, stage by stage.

    regen → pretokenize → prepare → hsextract → train → convert → serve → bench, each stage in its pinned image."""
    # lazy: planning and the config loader, only when the pipeline runs (the registry is read above, for the help)
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline.config import load_pipeline_config

    launcher = {k: values[k] for k in ("partition", "account", "qos", "nodes")}
    slurm = executor_flags(values["executor"], **launcher)
    overrides = PIPELINE.overrides(values) | ({"slurm": slurm} if slurm else {})
    resolved = load_pipeline_config(
        config_file=values["config"],
        opts=values["opts"] or (),
        overrides=overrides,
        typed_flags=PIPELINE.flags(),
    )
    runtime = values["runtime"] or ("local" if resolved.config.device == "cpu" else "docker")
    engine = get_runtime(runtime)
    stages = registry.select(values["stage"])
    workdir, executor, dry_run, force = (
        values["workdir"],
        values["executor"],
        values["dry_run"],
        values["force"],
    )
    target = Path(workdir) if workdir else planning.default_workdir(resolved.config)
    check_output_path(target, "--workdir", exists=True)  # reruns resume in an existing one
    plan = planning.build(resolved, stages, target, engine.name)
    if executor == "slurm":
        # lazy: the Slurm executor, only with --executor slurm
        from draftscope.pipeline.batch import submit as slurm_executor

        if dry_run:
            print("\n".join(slurm_executor.dry_run_lines(plan, engine)))
            return
        outcomes = slurm_executor.run(plan, engine, force=force, argv=sys.argv)
    elif dry_run:
        print("\n".join(planning.dry_run_lines(plan, engine)))
        return
    else:
        # lazy: the runner and the stages' checks, only for a real run
        from draftscope.pipeline.runner import run_pipeline

        outcomes = run_pipeline(plan, engine, force=force, argv=sys.argv)
    failed = [o for o in outcomes if o.status not in ("completed", "skipped")]
    if failed:
        raise Exit(f"{failed[0].stage}: {failed[0].status} ({failed[0].reason})", code=1)
    print(f"{plan.workdir}: {len(outcomes)} stage(s) done")


PIPELINE_TASKS = [pipeline]
