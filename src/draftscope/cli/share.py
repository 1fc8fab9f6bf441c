"""`invoke share`: pack a run for an issue report or a reviewer (the library is `draftscope.ops.share`)."""

from __future__ import annotations

from draftscope.cli.command import command
from draftscope.core.errors import UserError


@command(
    help={
        "run": "the run directory to pack",
        "output": "the bundle to write, e.g. bundle.tar.gz (a new file: an existing one is refused)",
        "include_text": "also pack prompts, generated tokens, logs and captured head calls (left out by default)",
        "keep_paths": "keep this host's absolute paths as recorded (by default: <run>/…, ~/…, …/NAME)",
    }
)
def share(c, run, output=None, include_text=False, keep_paths=False):
    """Pack a run to share: no prompt or generated text, with SHA256SUMS.

    Pack a run: manifest, config, summary, records without prompt or generated text, hardware, SHA256SUMS.

    The host's absolute paths are rewritten (<run>/…, ~/…, …/NAME) unless --keep-paths."""
    # lazy: tarfile and gzip, only for `share`; the command line starts without them
    from draftscope.ops.share import pack

    if not output:
        raise UserError("no bundle given", field="--output", fix="add --output NAME.tar.gz (a new file)")
    print("\n".join(pack(run, output, include_text=include_text, keep_paths=keep_paths).lines()))


SHARE_TASKS = (share,)
