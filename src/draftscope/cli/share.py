"""`invoke share`: pack a run for an issue report or a reviewer (the library is `draftscope.ops.share`)."""

from __future__ import annotations

from draftscope.bench.options import BENCHMARK
from draftscope.cli.command import command
from draftscope.core.options import Option, OptionTable

SHARE = OptionTable.of(
    Option("run", "the run directory to pack", positional=True),
    BENCHMARK.only("output").changed(
        "output",
        help="the bundle to write, e.g. bundle.tar.gz (a new file: an existing one is refused)",
        metavar="FILE",
        required=True,
        fix="add --output NAME.tar.gz (a new file)",
    ),
    Option(
        "include_text",
        "also pack prompts, generated tokens, logs and captured head calls (left out by default)",
        kind=bool,
    ),
    Option(
        "keep_paths",
        "keep this host's absolute paths as recorded (by default: <run>/…, ~/…, …/NAME)",
        kind=bool,
    ),
)


@command(table=SHARE)
def share(c, **values):
    """Pack a run to share: no prompt or generated text, with SHA256SUMS.

    Pack a run: manifest, config, summary, records without prompt or generated text, hardware, SHA256SUMS.

    The host's absolute paths are rewritten (<run>/…, ~/…, …/NAME) unless --keep-paths."""
    # lazy: tarfile and gzip, only for `share`; the command line starts without them
    from draftscope.ops.share import pack

    bundle = pack(
        values["run"], values["output"], include_text=values["include_text"], keep_paths=values["keep_paths"]
    )
    print("\n".join(bundle.lines()))


SHARE_TASKS = (share,)
