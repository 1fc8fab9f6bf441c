"""Benchmark commands: `plan`, `presets`, `benchmark` and `bench-overhead` (BENCH_TASKS).

Thin by design: each task parses its options, calls `draftscope.bench` or `draftscope.core.presets`, prints.
"""

from __future__ import annotations

import sys

from invoke import Exit

from draftscope.bench.options import BENCHMARK as BENCHMARK_OPTIONS
from draftscope.bench.options import PLAN as PLAN_OPTIONS
from draftscope.bench.overhead import measure, report_lines
from draftscope.bench.plan import load_prompts, plan_benchmark, prompt_overrides
from draftscope.cli.command import command, parse_int, preset_values
from draftscope.cli.render import console, plan_lines, preset_table, print_json, yaml_text
from draftscope.core import presets as P
from draftscope.core.jsonio import read_json
from draftscope.core.presets import load_experiment
from draftscope.ops.images import image_reference

DEFAULT_EXPERIMENTS = ("transformers-baseline", "vllm-int4-dflash2", "vllm-int4-dflash2-prefix")


@command(table=PLAN_OPTIONS)
def plan(c, **values):
    """Print the experiment plan: images, model pins, prompts, limits.

    Print the experiment plan: backends, images, model + revision, prompts + hash, repeats, limits, downloads."""
    names = values["experiment"] or list(DEFAULT_EXPERIMENTS)
    overrides = prompt_overrides(values["prompts"], values["dataset"], values["max_prompts"])
    plans = [plan_benchmark(load_experiment(n, overrides, values["opts"] or ())) for n in names]
    if values["json"]:
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


def _benchmark_defaults():
    # lazy: bench.options brings the supervisor and the Slurm launcher; the command line starts without them
    from draftscope.bench import options

    name, config = options.preset_defaults()
    return f"preset {name}", preset_values(config)


@command(table=BENCHMARK_OPTIONS, defaults=_benchmark_defaults)
def benchmark(c, **values):
    """Run a bounded greedy benchmark into a new run directory.

    Run a bounded, auditable greedy benchmark in its image (or locally) into a new run directory.

    The options lay over an experiment preset (--experiment, else the backend's); the defaults shown are those of a
    bare `invoke benchmark`. With --executor slurm it runs as one batch job of the Slurm launcher."""
    from draftscope.bench import options

    slurm = options.slurm_flags(values["executor"], **{k: values[k] for k in ("partition", "account", "qos")})
    config = options.config_from({k: values[k] for k in options.CONFIG_OPTIONS})
    output = values["output"]
    if values["dry_run"]:
        print("\n".join(options.dry_run_lines(config, output, executor=values["executor"], slurm=slurm)))
        return
    status, reason = options.run(config, output, executor=values["executor"], slurm=slurm, argv=sys.argv)
    print(f"{output}: {status}" + (f" ({reason})" if reason else ""))
    if status != "completed":
        raise Exit(code=1)


@command(help={"tokens": "tokens per request", "rounds": "interleaved rounds over the prompts"})
def bench_overhead(c, tokens=64, rounds=5):
    """The timing instrumentation's cost on the tiny model, as ratios.

    Timing instrumentation vs a bare greedy loop (and model.generate) on the tiny model, as ratios."""
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
