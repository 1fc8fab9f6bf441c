"""pretokenize: chat rows → `{id, input_ids, loss_mask}` rows with the target's own chat template.

speculators' `prepare-data` renders natural-language rows through a running vLLM server (a render endpoint); rows
that already carry `input_ids` and `loss_mask` pass straight through (docs/develop/integration-bugs.md, bug 2). This stage writes those
rows, so `prepare` needs no server. The tokenizing itself, and where the loss mask falls, is `encode.py`.

Output: `pretokenize/rows.jsonl` and `pretokenize/stats.json` (schema `stage-pretokenize`).
"""

from __future__ import annotations

from draftscope.core.errors import UserError
from draftscope.pipeline.base import (
    Artifact,
    Entry,
    Stage,
    StageContext,
    chat_file,
    chat_input,
    kit_argv,
    tokenizer_artifacts,
)
from draftscope.pipeline.stages.pretokenize import encode

NAME = "pretokenize"


def source(ctx: StageContext) -> str:
    """Regenerated rows when regen runs in this invocation or has completed in the workdir, else data.chat."""
    if "regen" in ctx.selected or ctx.host("stages", "regen.json").is_file():
        return "regen"
    return "chat"


def input_path(ctx: StageContext) -> str:
    if source(ctx) == "regen":
        return ctx.layout.at("regen", "rows.jsonl")
    return ctx.layout.chat


def max_length(ctx: StageContext) -> int:
    return ctx.config.pretokenize.max_length or ctx.preset.training.seq_length


def argv(ctx: StageContext) -> list[str]:
    opts = ctx.config.pretokenize
    out = kit_argv(
        ctx,
        NAME,
        "pretokenize",
        [
            "--input",
            input_path(ctx),
            "--tokenizer",
            ctx.layout.tokenizer,
            "--output",
            ctx.layout.at("pretokenize", "rows.jsonl"),
            "--stats",
            ctx.layout.at("pretokenize", "stats.json"),
            "--max-length",
            str(max_length(ctx)),
            "--overlong",
            opts.overlong,
            "--min-loss-tokens",
            str(opts.min_loss_tokens),
        ],
    )
    if ctx.config.data.max_rows and source(ctx) == "chat":
        out += ["--max-rows", str(ctx.config.data.max_rows)]
    return out


def inputs(ctx: StageContext) -> list[Artifact]:
    rows = Artifact("rows", ctx.host("regen", "rows.jsonl")) if source(ctx) == "regen" else chat_input(ctx)
    return [rows, *tokenizer_artifacts(ctx)]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("rows", ctx.host("pretokenize", "rows.jsonl")),
        Artifact("stats", ctx.host("pretokenize", "stats.json"), schema="stage-pretokenize"),
    ]


def check_inputs(ctx: StageContext) -> None:
    """When this stage reads data.chat itself, every row is read once before anything is written."""
    path = chat_file(ctx)
    if path is None or source(ctx) != "chat":
        return
    try:
        for _ in encode.read_rows(path, ctx.config.data.max_rows):
            pass
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte {exc.start})", source=str(path), field="data.chat") from None
    except ValueError as exc:
        raise UserError(f"not JSON Lines ({exc})", source=str(path), field="data.chat") from None


STAGE = Stage(
    name=NAME,
    image="train",
    summary="chat rows → input_ids + loss_mask with the target's chat template (no render endpoint)",
    uses_gpu=False,
    output_schema="stage-pretokenize",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    notes=lambda ctx: [
        f"input: {source(ctx)} rows; max length {max_length(ctx)} ({ctx.config.pretokenize.overlong})"
    ],
    entries=(Entry(NAME, "chat rows → ids + mask", encode.add_arguments, encode.main),),
    check_inputs=check_inputs,
)
