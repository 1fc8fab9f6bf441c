"""convert: a speculators checkpoint → the draft folder SGLang serves, every contract applied and checked.

The stage picks the configured epoch of `checkpoints/` and passes the preset's and config's values the checkpoint
must agree with (`expected_args`); the contracts themselves, the conversion and the re-read of the output are
`checkpoint.py`; every field that decides what SGLang computes, paired with its training option, is `semantics.py`;
the attention masks of both sides are compared layer by layer by `probe.py` before the folder is final. Output: `draft/config.json`, `draft/model.safetensors` and `draft/draftscope-convert.json`
(schema `stage-convert`).
"""

from __future__ import annotations

from draftscope.pipeline.base import (
    Artifact,
    Entry,
    Stage,
    StageContext,
    kit_argv,
    model_artifacts,
    served_context_length,
    tokenizer_artifacts,
)
from draftscope.pipeline.draft_flags import bool_flag, dflash2_head_args, dspark_head_args, mask_token_args
from draftscope.pipeline.stages.convert import checkpoint, entry

NAME = "convert"


def expected_args(ctx: StageContext) -> list[str]:
    """The preset's and config's values the checkpoint is checked against."""
    preset, config = ctx.preset, ctx.config
    args = [
        "--draft",
        config.draft,
        "--target-layer-ids",
        *map(str, preset.dflash.target_layer_ids),
        "--num-target-layers",
        str(preset.architecture.num_layers),
        "--num-draft-layers",
        str(preset.dflash.num_draft_layers),
        "--block-size",
        str(preset.dflash.block_size),
        "--vocab-size",
        str(preset.architecture.vocab_size),
        # the target's tokenizer names the mask token; the served context bounds the mask probe (probe.py)
        "--tokenizer",
        ctx.layout.tokenizer,
        "--max-context",
        str(served_context_length(ctx)),
    ]
    args += mask_token_args(preset)
    if preset.architecture.hidden_size is not None:
        args += ["--hidden-size", str(preset.architecture.hidden_size)]
    if config.draft == "dflash2":
        args += dflash2_head_args(config.train.dflash2)
    if config.draft == "dspark":
        ds = config.train.dspark
        args += [*dspark_head_args(ds), bool_flag("sample-from-anchor", ds.sample_from_anchor)]
    return args


def argv(ctx: StageContext) -> list[str]:
    return kit_argv(
        ctx,
        NAME,
        "convert",
        [
            "--checkpoints",
            ctx.layout.at("checkpoints"),
            "--epoch",
            str(ctx.config.convert.checkpoint),
            "--output",
            ctx.layout.at("draft"),
            *expected_args(ctx),
            *([] if ctx.config.convert.mask_probe else ["--no-mask-probe"]),
        ],
    )


def inputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("checkpoints", ctx.host("checkpoints"), kind="tree"),
        *model_artifacts(ctx),
        *tokenizer_artifacts(ctx),
    ]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("config", ctx.host("draft", "config.json")),
        Artifact("weights", ctx.host("draft", checkpoint.WEIGHTS)),
        Artifact("report", ctx.host("draft", checkpoint.REPORT), schema="stage-convert"),
    ]


def notes(ctx: StageContext) -> list[str]:
    if ctx.config.convert.mask_probe:
        return []
    return ["convert.mask_probe=false: the training and serving attention masks were not compared"]


STAGE = Stage(
    name=NAME,
    image="train",
    summary="speculators checkpoint → SGLang draft folder, every contract checked, output re-read",
    uses_gpu=False,
    output_schema="stage-convert",
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    notes=notes,
    entries=(Entry(NAME, "speculators checkpoint → SGLang draft", entry.add_arguments, entry.main),),
)
