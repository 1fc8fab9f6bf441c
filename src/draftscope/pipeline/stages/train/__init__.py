"""train: speculators' trainer under torchrun with the complete argv for the draft type and the preset's geometry.

Every flag the draft depends on is written out, defaults included, so the argv alone says what was trained
(and a changed upstream default cannot change a run silently):
- all: offline hidden states (`--hidden-states-backend file`, `--on-missing raise`), the preset's layer ids (+1,
  speculators' convention), block size, draft layers, anchors, sequence length, decay γ, mask token, seed; the full
  verifier vocabulary (no `--draft-vocab-size`, no token frequencies: `prepare` skips them).
- dflash: cross-entropy with D-PACE position weights; the anchor is the bonus token (`--no-sample-from-anchor`).
- dflash2: selector and local-convolution heads, non-causal sliding-window blocks, KL loss with fixed exponential
  decay, anchor = bonus token, full vocabulary (docs/develop/integration-bugs.md, bug 4).
- dspark: Markov head and confidence head with their options; sampling from the anchor as configured (SGLang's
  DSPARK worker reads it from the draft's config, which convert writes explicitly).

speculators writes `run.yaml` and `train_command.txt` (with versions) into the save path and each epoch folder, and
resumes from the latest checkpoint on a rerun. For the `tiny` preset on a CPU (`--runtime local`), a kit-owned
device shim (`cpu_train.py` beside this file) runs the same trainer in one process; the stage record says so.

Command: `torchrun --standalone --nproc_per_node N -m speculators.train` (speculators 0.9.0's module entry point;
`scripts/train.py` became a deprecation shim "to be removed in v0.9.0").
"""

from __future__ import annotations

from draftscope.pipeline.base import (
    Artifact,
    Stage,
    StageContext,
    exec_argv,
    model_artifacts,
    speculators_layer_ids,
)
from draftscope.pipeline.draft_flags import bool_flag, dflash2_head_args, dspark_head_args, mask_token_args
from draftscope.pipeline.stages.train.progress import TrainProgress

NAME = "train"

# Per draft type: the loss and the per-position weights (speculators' own defaults for each, written out).
LOSS = {
    "dflash": ("ce", "dpace"),
    "dflash2": ("kl_div", "fixed-exp-decay"),
    "dspark": ("kl_div", "fixed-exp-decay"),
}


def gpus(ctx: StageContext) -> tuple[int, ...]:
    if ctx.cpu:
        return ()
    return tuple(ctx.config.train.gpus) or tuple(range(ctx.preset.training.nproc_per_node))


def trainer_args(ctx: StageContext) -> list[str]:
    """The speculators trainer flags (shared by torchrun and the CPU shim)."""
    config, preset, opts = ctx.config, ctx.preset, ctx.config.train
    draft = config.draft
    loss_fn, position_weight = LOSS[draft]
    args = [
        "--verifier-name-or-path",
        ctx.layout.model,
        "--speculator-type",
        draft,
        "--data-path",
        ctx.layout.at("prepare"),
        "--hidden-states-backend",
        "file",
        "--hidden-states-path",
        ctx.layout.at("hidden_states"),
        "--on-missing",
        "raise",
        "--save-path",
        ctx.layout.at("checkpoints"),
        "--log-dir",
        ctx.layout.at("train", "logs"),
        "--seed",
        str(config.seed),
        "--total-seq-len",
        str(config.prepare.seq_length or preset.training.seq_length),
        "--hidden-states-dtype",
        opts.hidden_states_dtype,
        "--num-layers",
        str(preset.dflash.num_draft_layers),
        "--target-layer-ids",
        *map(str, speculators_layer_ids(preset)),
        "--block-size",
        str(preset.dflash.block_size),
        "--max-anchors",
        str(preset.training.max_anchors),
        "--dflash-decay-gamma",
        str(preset.dflash.decay_gamma),
        "--loss-fn",
        loss_fn,
        "--per-position-loss-weight",
        position_weight,
        "--sliding-window",
        str(opts.sliding_window),
    ]
    args += mask_token_args(preset)
    if draft == "dflash2":
        d2 = opts.dflash2
        args += [
            "--sliding-window-non-causal",
            "--no-sample-from-anchor",
            *dflash2_head_args(d2),
            "--selector-loss-alpha",
            str(d2.selector_loss_alpha),
        ]
    elif draft == "dspark":
        ds = opts.dspark
        args += [
            "--no-sliding-window-non-causal",
            bool_flag("sample-from-anchor", ds.sample_from_anchor),
            *dspark_head_args(ds),
            "--confidence-head-alpha",
            str(ds.confidence_head_alpha),
        ]
    else:
        args += ["--no-sliding-window-non-causal", "--no-sample-from-anchor"]
    epochs = opts.epochs or preset.training.epochs
    lr = opts.lr or preset.training.lr
    # On a CPU: no Triton (eager losses), no flex attention (SDPA), no worker processes; and no auto-resume, which
    # loads with pin_memory and fails without an accelerator (docs/develop/upstream-facts.md).
    cpu = ctx.cpu
    for flag, value in (
        ("--epochs", epochs),
        ("--lr", lr),
        ("--optimizer", opts.optimizer),
        ("--max-steps", opts.max_steps),
        ("--num-workers", opts.num_workers if opts.num_workers is not None else (0 if cpu else None)),
        ("--checkpoint-freq", opts.checkpoint_freq),
        ("--loss-implementation", opts.loss_implementation or ("eager" if cpu else None)),
        ("--draft-attn-impl", opts.draft_attn_impl or ("sdpa" if cpu else None)),
    ):
        if value is not None:
            args += [flag, str(value)]
    if cpu:
        args.append("--no-resume-from-checkpoint")
    return args


def upstream_argv(ctx: StageContext) -> list[str]:
    if ctx.cpu:
        return ["python", "-m", "draftscope.pipeline.stages.train.cpu_train", *trainer_args(ctx)]
    return [
        "torchrun",
        "--standalone",
        "--nproc_per_node",
        str(len(gpus(ctx))),
        "-m",
        "speculators.train",
        *trainer_args(ctx),
    ]


def argv(ctx: StageContext) -> list[str]:
    return exec_argv(ctx, NAME, upstream_argv(ctx))


def env(ctx: StageContext) -> dict[str, str]:
    found = gpus(ctx)
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, found))} if found else {}


def inputs(ctx: StageContext) -> list[Artifact]:
    return [
        Artifact("dataset", ctx.host("prepare"), kind="tree"),
        Artifact("hidden states", ctx.host("hidden_states"), kind="tree"),
        *model_artifacts(ctx),
    ]


def outputs(ctx: StageContext) -> list[Artifact]:
    return [Artifact("checkpoints", ctx.host("checkpoints"), kind="tree")]


def notes(ctx: StageContext) -> list[str]:
    if ctx.cpu:
        return ["CPU: the kit's device shim runs speculators' trainer in one process (tiny preset only)"]
    return [f"torchrun on GPUs {list(gpus(ctx))}; speculators resumes from the latest checkpoint on a rerun"]


STAGE = Stage(
    name=NAME,
    image="train",
    summary="speculators trainer (torchrun) with the complete argv per draft type",
    uses_gpu=True,
    output_schema=None,
    outputs=outputs,
    inputs=inputs,
    argv=argv,
    env=env,
    notes=notes,
    progress=TrainProgress,
)
