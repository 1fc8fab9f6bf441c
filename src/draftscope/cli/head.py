"""invoke tasks for the prefix-conditioned head: `head-study` (replay captured verification calls through both
policies) and `head-bench` (latency of dense vs coarse + refine at real shapes). Bodies live in `draftscope.head`."""

from __future__ import annotations

from draftscope.bench.options import BENCHMARK
from draftscope.cli.command import command
from draftscope.cli.render import console
from draftscope.core.options import Option, OptionTable
from draftscope.head import bench

MAX_HIDDEN = (
    1 << 16
)  # 65536: past every real model's hidden size (a 10^30 would end in torch, not in a message)
MAX_GROUP = 1 << 20  # K and the group sizes: past any vocabulary or hidden size

# The comma-separated lists are parsed (and checked) by `head.bench`, one message per bad item.
HEAD_BENCH = OptionTable.of(
    BENCHMARK.only("device").changed(
        "device", help="where the heads run", field=None, choices=("cpu", "cuda"), default="cpu"
    ),
    Option("vocab", "vocabulary sizes, comma-separated", default="151936,248320", metavar="SIZES"),
    Option("hidden", "hidden size", kind=int, minimum=1, maximum=MAX_HIDDEN, default=5120),
    Option("rows", "row counts, comma-separated", default="1,8,16", metavar="COUNTS"),
    Option("fallback", "fallback rates to price in, comma-separated", default="0,0.1,0.45", metavar="RATES"),
    BENCHMARK.only("repeats").changed(
        "repeats",
        help="timed repeats per cell (median reported; 3 keeps a full CPU run near 5 minutes)",
        field=None,
        default=3,
    ),
    BENCHMARK.only("output").changed("output", help="also write the results as JSON here", metavar="FILE"),
)


@command(name="head-bench", table=HEAD_BENCH)
def head_bench(c, **values):
    """Dense head vs the certified coarse head at real shapes, as ratios.

    Dense head vs coarse INT8 + refine (+ fallback) at real shapes, side by side as ratios, with the
    bytes-moved floor of each."""
    names = ("device", "vocab", "hidden", "rows", "fallback", "repeats", "output")
    bench.main(**{k: values[k] for k in names}, show=console().print)


HEAD_STUDY = OptionTable.of(
    Option("run", "a benchmark run directory made with --capture-head N", positional=True),
    Option(
        "k", "candidates refined per row beyond the top 2", kind=int, minimum=0, maximum=MAX_GROUP, default=64
    ),
    Option(
        "group_size",
        "INT8 scale group size",
        kind=int,
        minimum=1,
        maximum=MAX_GROUP,
        default_text="one scale per row",
    ),
    Option(
        "int4_group_size",
        "INT4 tier group size",
        kind=int,
        minimum=1,
        maximum=MAX_GROUP,
        default_text="128, or the largest divisor of the hidden size below it",
    ),
    BENCHMARK.only("output").changed(
        "output",
        help="folder to create for study.json and the figures",
        default_text="runs/head-study-<run>",
    ),
)


@command(name="head-study", table=HEAD_STUDY)
def head_study(c, **values):
    """Replay a run's captured verification calls through the certified head.

    Replay a run's captured verification calls through the certified head: row-wise vs prefix fallbacks,
    certified and uncertified rows, margins, the K that would have sufficed, ties; the INT8 and INT4 coarse tiers
    side by side; schema-valid JSON."""
    # lazy: head.study brings the tiny models' package (for the kit's head); the command line starts without it
    from draftscope.head import study

    study.main(
        values["run"],
        k=values["k"],
        group_size=values["group_size"],
        int4_group_size=values["int4_group_size"],
        output=values["output"],
        show=console().print,
    )


HEAD_TASKS = [head_bench, head_study]
