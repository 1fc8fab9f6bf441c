"""prepare: speculators' `prepare-data` on the pretokenized rows → a `datasets` folder + token frequencies.

The rows already carry `input_ids` and `loss_mask`, so no `--render-endpoint` is passed and no server runs
(docs/develop/integration-bugs.md, bug 2). `--overwrite` is always passed: without it `prepare-data` keeps an existing dataset and exits
successfully, so a forced rerun would silently train on stale data (it deletes only its own artifacts).
`--skip-token-freq` is explicit: the kit trains every draft on the full verifier vocabulary (DFlash2 requires it,
and SGLang's drafts borrow the target's embedding and LM head), so no vocabulary mapping is built.

Command: `python -m speculators prepare-data` from the pinned speculators 0.9.0 (its `scripts/prepare_data.py` was a
deprecation shim "to be removed in v0.9.0"; the library CLI is what the release ships).
"""

from __future__ import annotations

from draftscope.pipeline.base import Artifact, Stage, StageContext, exec_argv, tokenizer_artifacts

NAME = "prepare"


def seq_length(ctx: StageContext) -> int:
    return ctx.config.prepare.seq_length or ctx.preset.training.seq_length


def upstream_argv(ctx: StageContext) -> list[str]:
    opts = ctx.config.prepare
    argv = [
        "python",
        "-m",
        "speculators",
        "prepare-data",
        "--model",
        ctx.layout.tokenizer,
        "--data",
        ctx.layout.at("pretokenize", "rows.jsonl"),
        "--output",
        ctx.layout.at("prepare"),
        "--seq-length",
        str(seq_length(ctx)),
        "--seed",
        str(ctx.config.seed),
        "--skip-token-freq",
        "--overwrite",
    ]
    if opts.max_samples:
        argv += ["--max-samples", str(opts.max_samples)]
    if opts.workers:
        argv += ["--num-preprocessing-workers", str(opts.workers)]
    if opts.minimum_valid_tokens:
        argv += ["--minimum-valid-tokens", str(opts.minimum_valid_tokens)]
    return argv


def argv(ctx: StageContext) -> list[str]:
    return exec_argv(ctx, NAME, upstream_argv(ctx))


def inputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("rows", ctx.host("pretokenize", "rows.jsonl")), *tokenizer_artifacts(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("dataset", ctx.host("prepare"), kind="tree")]


STAGE = Stage(
    name=NAME,
    image="train",
    summary="speculators prepare-data on pretokenized rows (no render endpoint)",
    uses_gpu=False,
    output_schema=None,
    outputs=outputs,
    inputs=inputs,
    argv=argv,
)
