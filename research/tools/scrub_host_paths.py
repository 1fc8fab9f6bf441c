"""Rewrite the packing host's paths in evidence before it is committed, by the rule `invoke share` applies.

    python research/tools/scrub_host_paths.py PATH [PATH ...] [--check]

A run directory records exactly what ran: its steps' argv name this machine's interpreter and the absolute run
directory, its command line the checkout given to `invoke -r`, and an engine's log the site-packages it imported
from. Those paths name a user and a directory layout, and no reader needs them (inputs are identified by their
SHA-256). Each PATH is a run directory or a single JSON file (a measurement). In a run directory the JSON members
(manifest.json, summary.json, worker.json) are rewritten with `draftscope.ops.share.HostPaths` (the same object
`invoke share` uses: `<run>/REST` inside the run, wherever it is now or was when it ran; `~/REST` under the home of
the user who runs this; `…/NAME` anywhere else; the containers' own paths kept), and every line of logs/*.log with
its text rule. records.jsonl and inputs/ are left byte for byte: they hold the prompts and the generated tokens
the evidence is about, and no host path.

The rewrite is idempotent, which is what `--check` tests: it changes nothing and exits 1 naming every file that
a rewrite would still change. Update SHA256SUMS for the files it rewrote (`invoke evidence.verify` names them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from draftscope.ops.share import HostPaths

JSON_MEMBERS = ("manifest.json", "summary.json", "worker.json")


def _rewrites(path: Path) -> list[tuple[Path, bytes]]:
    """(file, its new bytes) for every file under `path` whose paths a rewrite changes."""
    if path.is_file():
        paths = HostPaths([], os.path.expanduser("~"))
        data = path.read_bytes()
        out, changed = paths.member(data)
        return [(path, out)] if changed else []
    manifest_file = path / "manifest.json"
    manifest = json.loads(manifest_file.read_text(encoding="utf-8")) if manifest_file.is_file() else {}
    paths = HostPaths.for_run(path, manifest)
    found: list[tuple[Path, bytes]] = []
    for name in JSON_MEMBERS:
        member = path / name
        if member.is_file():
            out, changed = paths.member(member.read_bytes())
            if changed:
                found.append((member, out))
    for log in sorted((path / "logs").glob("*.log")):
        text = log.read_bytes().decode("utf-8", "surrogateescape")  # bytes: a progress bar's \r stays a \r
        new = paths.text(text)
        if new != text:
            found.append((log, new.encode("utf-8", "surrogateescape")))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run directories or JSON files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a rewrite would")
    args = parser.parse_args(argv)
    pending = [item for path in args.paths for item in _rewrites(path)]
    for file, data in pending:
        if args.check:
            print(f"{file}: names a host path", file=sys.stderr)
        else:
            file.write_bytes(data)
            print(f"rewrote {file}")
    return 1 if args.check and pending else 0


if __name__ == "__main__":
    sys.exit(main())
