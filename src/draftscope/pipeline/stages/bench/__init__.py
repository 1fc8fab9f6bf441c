"""bench: greedy requests to every SGLang instance; mean acceptance length and rate of the trained draft.

The acceptance figure comes from each response's `meta_info.spec_accept_length` (per request, so the run's mean is
exact); `/server_info` (`internal_states[0].avg_spec_accept_length`, cumulative) cross-checks it, and `/metrics` is
scraped with prometheus_client's text parser for the `sglang:*` gauges — which cover only the last logging window
and are recorded, not averaged. The stage starts the same instances as `serve`, runs the prompts, stops them and
writes `bench/bench.json` (schema `stage-bench`). On a CPU it runs SGLang's CPU engine, as serve does.
"""

from __future__ import annotations

from draftscope.pipeline.base import Artifact, Command, Entry, Stage, StageContext, kit_argv
from draftscope.pipeline.stages import serve
from draftscope.pipeline.stages.bench import runner

NAME = "bench"


def commands(ctx: StageContext) -> list[Command]:
    return serve.commands(ctx)


def argv(ctx: StageContext) -> list[str]:
    opts = ctx.config.bench
    return kit_argv(
        ctx,
        NAME,
        "bench",
        [
            "--commands",
            ctx.layout.at("stages", "bench.commands.json"),
            "--prompts",
            ctx.layout.prompts,
            "--output",
            ctx.layout.at("bench", "bench.json"),
            "--draft",
            serve.draft_kind(ctx),
            "--algorithm",
            serve.algorithm(ctx),
            "--draft-tokens",
            str(serve.draft_tokens(ctx)),
            "--max-new-tokens",
            str(opts.max_new_tokens),
            "--repeats",
            str(opts.repeats),
            "--startup-timeout",
            str(ctx.config.serve.startup_timeout_s),
        ],
    )


def inputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("prompts", ctx.inputs["prompts"]), *serve.inputs(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("results", ctx.host("bench", "bench.json"), schema="stage-bench")]


STAGE = Stage(
    name=NAME,
    image="sglang",
    summary="greedy prompts to each instance: acceptance from meta_info, /server_info and /metrics",
    uses_gpu=True,
    output_schema="stage-bench",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    commands=commands,
    notes=lambda ctx: serve.notes(ctx),
    entries=(Entry(NAME, "acceptance on SGLang instances", runner.add_arguments, runner.main),),
    engine="sglang",
    cpu_image=serve.CPU_IMAGE,
    cpu_check=serve.cpu_check,
)
