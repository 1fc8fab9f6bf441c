"""The `pipeline` task: the 8-stage draft-training pipeline, or a dry run of it. Thin: the library plans and runs."""

from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit

from draftscope.cli.command import command
from draftscope.core.outputs import check_output_path
from draftscope.execute.slurm.options import executor_flags
from draftscope.pipeline import registry
from draftscope.runtime import get_runtime


@command(
    iterable=["opts"],
    help={
        "draft": "draft type: dflash (default), dflash2 or dspark",
        "preset": "model preset (invoke presets; default qwen38-27b)",
        "config": "run config YAML (or the name of a file in presets/pipelines/)",
        "stage": f"all (default), or stage names separated by commas: {','.join(registry.NAMES)}",
        "workdir": "the pipeline's working folder (default runs/pipeline-<preset>-<draft>); reruns resume in it",
        "opts": "override a config field, key=value (repeatable), e.g. data.chat=chat.jsonl or train.epochs=2",
        "runtime": "docker (default), podman, or local (this environment; the tiny preset on a CPU)",
        "dry_run": "print every stage's image and exact container command, and stop; creates nothing",
        "force": "rerun stages even when their record says they completed with the same inputs",
        "executor": "local (default): run the stages here, one after another; slurm: submit each stage as a "
        "Slurm job (sbatch) that runs it through the same runtime, and follow the jobs (Ctrl-C cancels them)",
        "partition": "slurm: the partition (config: slurm.partition; per stage: slurm.stages.<stage>.partition)",
        "account": "slurm: the account to charge (slurm.account)",
        "qos": "slurm: the quality of service (slurm.qos)",
        "nodes": "slurm: nodes for training (srun + torchrun) and shards of regen and hsextract (job arrays); default 1",
    },
)
def pipeline(
    c,
    draft=None,
    preset=None,
    config=None,
    stage="all",
    workdir=None,
    opts=None,
    runtime=None,
    dry_run=False,
    force=False,
    executor="local",
    partition=None,
    account=None,
    qos=None,
    nodes=None,
):
    """Train and serve a DFlash / DFlash2 / DSpark draft: regen → pretokenize → prepare → hsextract → train →
    convert → serve → bench, each stage in its pinned image."""
    # lazy: planning and the config loader, only when the pipeline runs (the registry is read above, for the help)
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline.config import load_pipeline_config

    slurm = executor_flags(executor, partition=partition, account=account, qos=qos, nodes=nodes)
    resolved = load_pipeline_config(
        draft=draft,
        preset=preset,
        config_file=config,
        opts=opts or (),
        overrides={"slurm": slurm} if slurm else None,
    )
    engine = get_runtime(runtime or ("local" if resolved.config.device == "cpu" else "docker"))
    stages = registry.select(stage)
    target = Path(workdir) if workdir else planning.default_workdir(resolved.config)
    check_output_path(target, "--workdir", exists=True)  # reruns resume in an existing one
    plan = planning.build(resolved, stages, target, engine.name)
    if executor == "slurm":
        # lazy: the Slurm executor, only with --executor slurm
        from draftscope.pipeline.slurm import submit as slurm_executor

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
