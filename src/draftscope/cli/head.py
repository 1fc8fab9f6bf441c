"""invoke tasks for the prefix-conditioned head: `head-study` (replay captured verification calls through both
policies) and `head-bench` (latency of dense vs coarse + refine at real shapes). Bodies live in `draftscope.head`."""

from __future__ import annotations

from draftscope.cli.command import command, parse_int
from draftscope.cli.render import console
from draftscope.head import bench

MAX_HIDDEN = (
    1 << 16
)  # 65536: past every real model's hidden size (a 10^30 would end in torch, not in a message)


@command(
    name="head-bench",
    help={
        "device": "cpu (default) or cuda",
        "vocab": "vocabulary sizes, comma-separated (default 151936,248320)",
        "hidden": "hidden size (default 5120)",
        "rows": "row counts, comma-separated (default 1,8,16)",
        "fallback": "fallback rates to price in, comma-separated (default 0,0.1,0.45)",
        "repeats": "timed repeats per cell (median reported; default 3 keeps a full CPU run near 5 minutes)",
        "output": "also write the results as JSON here",
    },
)
def head_bench(
    c,
    device="cpu",
    vocab="151936,248320",
    hidden=5120,
    rows="1,8,16",
    fallback="0,0.1,0.45",
    repeats=3,
    output=None,
):
    """Dense head vs the certified coarse head at real shapes, as ratios.

    Dense head vs coarse INT8 + refine (+ fallback) at real shapes, side by side as ratios, with the
    bytes-moved floor of each."""
    bench.main(
        device=device,
        vocab=vocab,
        hidden=parse_int(hidden, "--hidden", 1, MAX_HIDDEN),
        rows=rows,
        fallback=fallback,
        repeats=parse_int(repeats, "--repeats", 1, 1000),
        output=output,
        show=console().print,
    )


@command(
    name="head-study",
    help={
        "run": "a benchmark run directory made with --capture-head N",
        "k": "candidates refined per row beyond the top 2 (default 64)",
        "group_size": "INT8 scale group size (default: one scale per row)",
        "int4_group_size": "INT4 tier group size (default 128, or the largest divisor of the hidden size below it)",
        "output": "folder to create for study.json and the figures (default runs/head-study-<run>)",
    },
)
def head_study(c, run, k=64, group_size=None, int4_group_size=None, output=None):
    """Replay a run's captured verification calls through the certified head.

    Replay a run's captured verification calls through the certified head: row-wise vs prefix fallbacks,
    certified and uncertified rows, margins, the K that would have sufficed, ties; the INT8 and INT4 coarse tiers
    side by side; schema-valid JSON."""
    # lazy: head.study brings the tiny models' package (for the kit's head); the command line starts without it
    from draftscope.head import study

    k = parse_int(k, "-k", 0, 1 << 20)
    size = parse_int(group_size, "--group-size", 1, 1 << 20) if group_size else None
    size4 = parse_int(int4_group_size, "--int4-group-size", 1, 1 << 20) if int4_group_size else None
    study.main(run, k=k, group_size=size, int4_group_size=size4, output=output, show=console().print)


HEAD_TASKS = [head_bench, head_study]
