"""Rewrite the packing host's paths in evidence before it is committed, by the rule `invoke share` applies.

    python research/tools/scrub_host_paths.py PATH [PATH ...] [--check]

A run directory records exactly what ran: its steps' argv name this machine's interpreter and the absolute run
directory, its command line the checkout given to `invoke -r`, and an engine's log the site-packages it imported
from. Those paths name a user and a directory layout, and no reader needs them (inputs are identified by their
SHA-256). Each PATH is a run directory or a single JSON file (a measurement). `draftscope.ops.share.host_path_rewrites`
(which `invoke evidence.add` applies to new evidence) rewrites, with the object `invoke share` uses, the run's JSON
members (manifest.json, summary.json, worker.json) and its logs/*.log: `<run>/REST` inside the run, wherever it is
now or was when it ran; `~/REST` under the home of the user who runs this; `…/NAME` anywhere else; the containers'
own paths kept. records.jsonl and inputs/ are left byte for byte: they hold the prompts and the generated tokens
the evidence is about, and no host path.

The rewrite is idempotent, which is what `--check` tests: it changes nothing and exits 1 naming every file that
a rewrite would still change. Update SHA256SUMS for the files it rewrote (`invoke evidence.verify` names them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftscope.ops.share import host_path_rewrites


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or JSON files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a rewrite would")
    args = parser.parse_args(argv)
    pending = [item for path in args.paths for item in host_path_rewrites(path)]
    for file, data in pending:
        if args.check:
            print(f"{file}: names a host path", file=sys.stderr)
        else:
            file.write_bytes(data)
            print(f"rewrote {file}")
    return 1 if args.check and pending else 0


if __name__ == "__main__":
    sys.exit(main())
