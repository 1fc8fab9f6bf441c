"""`invoke tiny.*`: the kit-built tiny models (see `draftscope.tiny`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from invoke import Exit

from draftscope.cli.command import command, group, parse_int

MAX_STEPS = 1_000_000  # training steps; the kit's own are a few thousand


@command(
    help={
        "check": "only verify the shipped files against their SHA-256 and load the target offline (seconds)",
        "install": "copy the rebuild over the shipped files and record its hashes and figures in the preset",
        "target_steps": "target training steps (default: the kit's; other values cannot reproduce the hashes)",
        "draft_steps": "draft training steps (default: the kit's)",
        "output": "build into this new folder and keep it (default: a temporary folder)",
    }
)
def build(c, check=False, install=False, target_steps=None, draft_steps=None, output=None):
    """Rebuild the tiny tokenizer, target and draft from standard sources.

    Rebuild the tiny tokenizer, target and draft from the standard library's sources; report per file whether
    the rebuild reproduced the shipped SHA-256. --check verifies the shipped files instead of rebuilding."""
    # lazy: the tiny models' package (builder, rich's progress display); the command line starts without it
    from draftscope import tiny

    if check:
        if install or target_steps or draft_steps or output:
            raise Exit("error: --check takes no other option", code=2)
        print("\n".join(tiny.check_lines()))
        return
    steps = {
        "target_steps": parse_int(target_steps, "--target-steps", 1, MAX_STEPS)
        if target_steps
        else tiny.TARGET_STEPS,
        "draft_steps": parse_int(draft_steps, "--draft-steps", 1, MAX_STEPS)
        if draft_steps
        else tiny.DRAFT_STEPS,
    }
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
