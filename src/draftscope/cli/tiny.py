"""`invoke tiny.*`: the kit-built tiny models (see `draftscope.tiny`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from invoke import Exit

from draftscope.bench.options import BENCHMARK
from draftscope.cli.command import command, group
from draftscope.core.options import Option, OptionTable
from draftscope.tiny.builder import DRAFT_STEPS, TARGET_STEPS

MAX_STEPS = 1_000_000  # training steps; the kit's own are a few thousand

# The steps have their defaults in words only: --check refuses every other option, so the body sees which were typed.
BUILD = OptionTable.of(
    Option(
        "check",
        "only verify the shipped files against their SHA-256 and load the target offline (seconds)",
        kind=bool,
    ),
    Option(
        "install",
        "copy the rebuild over the shipped files and record its hashes and figures in the preset",
        kind=bool,
    ),
    Option(
        "target_steps",
        "target training steps (other values cannot reproduce the hashes)",
        kind=int,
        minimum=1,
        maximum=MAX_STEPS,
        default_text=f"{TARGET_STEPS}, the kit's",
    ),
    Option(
        "draft_steps",
        "draft training steps",
        kind=int,
        minimum=1,
        maximum=MAX_STEPS,
        default_text=f"{DRAFT_STEPS}, the kit's",
    ),
    BENCHMARK.only("output").changed(
        "output", help="build into this new folder and keep it", default_text="a temporary folder"
    ),
)


@command(table=BUILD)
def build(c, **values):
    """Rebuild the tiny tokenizer, target and draft from standard sources.

    Rebuild the tiny tokenizer, target and draft from the standard library's sources; report per file whether
    the rebuild reproduced the shipped SHA-256. --check verifies the shipped files instead of rebuilding."""
    # lazy: the tiny models' package (its loaders and rich's progress display), only for `build`
    from draftscope import tiny

    install, target_steps, draft_steps, output = (
        values[k] for k in ("install", "target_steps", "draft_steps", "output")
    )
    if values["check"]:
        if install or target_steps or draft_steps or output:
            raise Exit("error: --check takes no other option", code=2)
        print("\n".join(tiny.check_lines()))
        return
    steps = {"target_steps": target_steps or TARGET_STEPS, "draft_steps": draft_steps or DRAFT_STEPS}
    if output:
        _rebuild(Path(output), steps, install)
        return
    with tempfile.TemporaryDirectory(prefix="draftscope-tiny-") as tmp:
        _rebuild(Path(tmp) / "tiny", steps, install)


def _rebuild(folder: Path, steps: dict[str, int], install: bool) -> None:
    from draftscope import tiny  # lazy: as in `build`

    with tiny.progress_display() as progress:
        record = tiny.build(folder, progress=progress, **steps)
    lines, reproduced = tiny.report_lines(record)
    print("\n".join(lines))
    if install:
        tiny.install(folder, record)
        print(f"installed into {tiny.assets_dir()} and recorded in the tiny preset")
    elif not reproduced:
        print("the shipped files were kept; `invoke tiny.build --install` replaces them with this rebuild")


ns_tiny = group("tiny", build)
