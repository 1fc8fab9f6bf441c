"""Benchmark commands: `plan`, `presets`, `benchmark` and `bench-overhead` (BENCH_TASKS).

Thin by design: each task parses its options, calls `draftscope.bench` or `draftscope.core.presets`, prints.
"""

from __future__ import annotations

import sys

from invoke import Exit

from draftscope.bench.backends import BACKENDS
from draftscope.bench.overhead import measure, report_lines
from draftscope.bench.plan import load_prompts, plan_benchmark, prompt_overrides
from draftscope.cli.command import command, parse_int
from draftscope.cli.render import console, plan_lines, preset_table, print_json, yaml_text
from draftscope.core import presets as P
from draftscope.core.jsonio import read_json
from draftscope.core.presets import load_experiment
from draftscope.ops.images import image_reference

DEFAULT_EXPERIMENTS = ("transformers-baseline", "vllm-int4-dflash2", "vllm-int4-dflash2-prefix")


@command(
    iterable=["experiment", "opts"],
    help={
        "experiment": "experiment preset to plan (repeatable; default: the baseline, INT4 + DFlash2, and prefix)",
        "prompts": "prompt file (JSON, see schemas/prompts.schema.json)",
        "dataset": "a prompt set the kit ships, instead of --prompts (invoke datasets lists them)",
        "max_prompts": "only the first N prompts of the file, in file order",
        "opts": "override a config field, key=value (repeatable), e.g. repeats=3",
        "json": "print the plan as JSON",
    },
)
def plan(c, experiment=None, prompts=None, dataset=None, max_prompts=None, opts=None, json=False):
    """Print the experiment plan: backends, images, model + revision, prompts + hash, repeats, limits, downloads."""
    names = experiment or list(DEFAULT_EXPERIMENTS)
    overrides = prompt_overrides(prompts, dataset, max_prompts)
    plans = [plan_benchmark(load_experiment(n, overrides, opts or ())) for n in names]
    if json:
        print_json([p.to_dict() for p in plans])
        return
    for i, p in enumerate(plans):
        if i:
            print()
        print("\n".join(plan_lines(p, image_reference)))


@command(help={"show": "print one preset (model or experiment), fully resolved, as YAML"})
def presets(c, show=None):
    """List the model and experiment presets, or show one resolved."""
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


@command(
    iterable=["opts"],
    help={
        "backend": f"the benchmark backend: {' or '.join(BACKENDS)}",
        "experiment": "experiment preset to start from (default: by backend)",
        "int4_dflash": "vLLM: the INT4 target with the DFlash2 draft",
        "experimental_prefix": "vLLM: the experimental prefix-conditioned head (INT4 + DFlash2 on a GPU; the tiny CPU "
        "engine loads it and records why it stays off)",
        "preset": "model preset (invoke presets)",
        "prompts": "prompt file (JSON)",
        "dataset": "a prompt set the kit ships, instead of --prompts (invoke datasets lists them)",
        "max_prompts": "only the first N prompts of the file, in file order (recorded in the config)",
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
        "dtype": "auto (default: bfloat16 on capability >= 8.0, float16 below, float32 on the CPU), bfloat16, "
        "float16 or float32",
    },
)
def benchmark(
    c,
    backend=None,
    experiment=None,
    int4_dflash=False,
    experimental_prefix=False,
    preset=None,
    prompts=None,
    dataset=None,
    max_prompts=None,
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
    dtype=None,
):
    """Run a bounded, auditable greedy benchmark in its image (or locally) into a new run directory; with
    --executor slurm, as a Slurm job."""
    # lazy: bench.options brings the supervisor and the Slurm executor; the command line starts without them
    from draftscope.bench import options

    slurm = options.slurm_flags(executor, partition=partition, account=account, qos=qos)
    config = options.experiment_config(
        backend=backend,
        experiment=experiment,
        int4_dflash=int4_dflash,
        experimental_prefix=experimental_prefix,
        preset=preset,
        prompts=prompts,
        dataset=dataset,
        max_prompts=max_prompts,
        max_seconds=max_seconds,
        repeats=repeats,
        warmups=warmups,
        memory_fraction=memory_fraction,
        model=model,
        revision=revision,
        draft=draft,
        draft_revision=draft_revision,
        draft_tokens=draft_tokens,
        fixed_tokens=fixed_tokens,
        max_new_tokens=max_new_tokens,
        device=device,
        runtime=runtime,
        opts=opts or (),
        head=head,
        head_shadow=head_shadow,
        capture_head=capture_head,
        dtype=dtype,
    )
    if dry_run:
        print("\n".join(options.dry_run_lines(config, output, executor=executor, slurm=slurm)))
        return
    status, reason = options.run(config, output, executor=executor, slurm=slurm, argv=sys.argv)
    print(f"{output}: {status}" + (f" ({reason})" if reason else ""))
    if status != "completed":
        raise Exit(code=1)


@command(help={"tokens": "tokens per request", "rounds": "interleaved rounds over the prompts"})
def bench_overhead(c, tokens=64, rounds=5):
    """Timing instrumentation vs a bare greedy loop (and model.generate) on the tiny model, as ratios."""
    # lazy: the tiny models' package (builder, rich's progress display); the command line starts without it
    from draftscope import tiny

    # checked before the models load: `nan` or 0 used to end in a traceback from the decode loop
    tokens, rounds = parse_int(tokens, "--tokens", 1, 4096), parse_int(rounds, "--rounds", 1, 1000)
    tokenizer, model = tiny.load_tokenizer(), tiny.load_target(device="cpu")
    prompts = read_json(load_prompts("examples/prompts.json").path)["prompts"][:4]
    encoded = []
    for p in prompts:
        out = tokenizer.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
        encoded.append(list(getattr(out, "input_ids", out)))
    print("\n".join(report_lines(measure(model, encoded, tokens=tokens, rounds=rounds))))


BENCH_TASKS = (plan, presets, benchmark, bench_overhead)
