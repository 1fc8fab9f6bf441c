"""`invoke pipeline`'s options, each written once (`PIPELINE`, an `OptionTable`): the draft and target it trains
(pipeline config fields, laid over the config file), which stages run and where, and the launcher's (`LAUNCHER`)."""

from __future__ import annotations

from typing import Any

from draftscope.core.options import SHARED, Option, OptionTable
from draftscope.execute.options import LAUNCHER
from draftscope.pipeline import registry
from draftscope.pipeline.config import DEFAULT_DRAFT, DEFAULT_PRESET, DRAFTS

PIPELINE = OptionTable.of(
    Option(
        "draft", "the draft architecture speculators trains and SGLang serves", field="draft", choices=DRAFTS
    ),
    SHARED.only("preset"),
    Option("config", "run config YAML (its fields: schemas/pipeline-config.schema.json)", metavar="FILE"),
    Option(
        "stage",
        f"all, or stage names separated by commas: {','.join(registry.NAMES)}",
        default="all",
        metavar="STAGES",
    ),
    Option(
        "workdir",
        "the pipeline's working folder (default runs/pipeline-<preset>-<draft>); reruns resume in it",
        metavar="DIR",
    ),
    SHARED.only("opts").changed(
        "opts",
        help="override a config field, key=value (repeatable), e.g. data.chat=chat.jsonl or train.epochs=2",
    ),
    SHARED.only("runtime").changed(
        "runtime",
        help="where the stages run: docker (default; local for the tiny preset on a CPU), podman, or local (this "
        "environment)",
    ),
    SHARED.only("dry_run").changed(
        "dry_run", help="print every stage's image and exact container command, and stop; creates nothing"
    ),
    Option(
        "force", "rerun stages even when their record says they completed with the same inputs", kind=bool
    ),
    LAUNCHER.changed(
        "executor",
        help="local: run the stages here, one after another; slurm: submit each stage as a batch job of the Slurm "
        "launcher that runs it through the same runtime, and follow the jobs (Ctrl-C cancels them)",
    ),
)


def defaults() -> tuple[str, Any]:
    """Where the help's defaults come from: the pipeline config's own (no config file, no option)."""
    values = {"draft": DEFAULT_DRAFT, "model_preset": DEFAULT_PRESET}
    return "pipeline default", values.get
