"""`invoke demo`: the whole kit on a CPU, end to end (`make demo` sets up the CPU environment, .venv-train, and calls it)."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit

from draftscope.bench.options import BENCHMARK
from draftscope.cli.command import command
from draftscope.core import settings
from draftscope.core.options import SHARED, Option, OptionTable
from draftscope.ops import demo as D

DEMO = OptionTable.of(
    BENCHMARK.only("output").changed(
        "output", help="the demo folder to create (never overwritten)", default_text="runs/demo-<time>"
    ),
    Option(
        "train_python",
        "python of an environment with speculators 0.9.0 for the pipeline's train stage (make demo uses "
        ".venv-train)",
        metavar="PYTHON",
        default_text=f"${settings.DRAFTSCOPE_TRAIN_PYTHON.name}",
    ),
    SHARED.only("dry_run").changed("dry_run", help="list the steps and their commands, and stop"),
)


@command(table=DEMO)
def demo(c, **values):
    """The whole kit on the tiny models on a CPU, in minutes.

    Baseline, speculative and prefix-head benchmarks on the tiny models, a head study, the tiny pipeline through
    convert, validation, a report and two comparisons — then a summary. CPU only; nothing is downloaded."""
    output, train_python = values["output"], values["train_python"]
    if values["dry_run"]:
        root = Path(output or "runs/demo-<time>")
        for i, step in enumerate(D.steps_for_display(root, train_python or "<train python>"), 1):
            print(f"[{i}] {step.title}\n    {Path(step.python).name} {' '.join(step.argv)}")
        return
    code = D.main(output=output, train_python=train_python)
    if code:
        raise Exit(code=code)


DEMO_TASKS = [demo]
