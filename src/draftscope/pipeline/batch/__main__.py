"""`python -m draftscope.pipeline.batch COMMAND`: what a pipeline's job scripts run on a node.

- `run-step --plan P --stage S [--shard I] [--rdzv-endpoint HOST:PORT]`: one stage (one shard of a job array,
  one node of a training job) through the runtime; writes the stage record (or the shard's outcome).
- `merge --plan P --stage regen`: after regen's job array: account for every row, merge, write the record.
- `check --plan P --stage hsextract`: after hsextract's job array: check every row's file, write the record.
- `cleanup --plan P --stage S [--shard I] [--check]`: remove the job's container now (the SIGTERM trap).

A benchmark's job runs `python -m draftscope.bench.batch` instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftscope.execute.injob import main_guard
from draftscope.pipeline.batch import commands


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="python -m draftscope.pipeline.batch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = root.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run-step", "run one stage, shard or training node through the runtime"),
        ("merge", "merge a job array's shards and write the stage record"),
        ("check", "check a job array's whole output and write the stage record"),
        ("cleanup", "remove the job's container (SIGTERM trap)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--plan", required=True, type=Path, help="the workdir's slurm/plan.json")
        p.add_argument("--stage", required=True)
        if name not in ("merge", "check"):
            p.add_argument("--shard", type=int, default=None, help="the array task's index")
        if name == "cleanup":
            p.add_argument("--check", action="store_true", help="the check job's container")
        if name == "run-step":
            p.add_argument("--rdzv-endpoint", default=None, help="training across nodes: HOST:PORT of node 0")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "run-step":
        return main_guard(
            lambda: commands.run_step(
                args.plan, args.stage, shard=args.shard, rdzv_endpoint=args.rdzv_endpoint
            )
        )
    if args.command == "merge":
        return main_guard(lambda: commands.merge(args.plan, args.stage))
    if args.command == "check":
        return main_guard(lambda: commands.check(args.plan, args.stage))
    return main_guard(lambda: commands.cleanup(args.plan, args.stage, shard=args.shard, check=args.check))


if __name__ == "__main__":
    sys.exit(main())
