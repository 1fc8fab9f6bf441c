"""tests/gpu/gpu_check.sh --dry-run (issue 33, acceptance 7): it lists each part with what it proves and what it runs,
and every test it names exists — collected by pytest here, where they skip without a GPU."""

from __future__ import annotations

import re
import subprocess
import sys

from support import ROOT

SCRIPT = ROOT / "tests" / "gpu" / "gpu_check.sh"


def _dry_run() -> str:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_part_says_what_it_proves_and_what_it_runs():
    text = _dry_run()
    parts = re.findall(r"^part (\S+) \(at most (\d+) s\): (.+)$", text, re.M)
    names = [p[0] for p in parts]
    assert names == ["hardware", "head-graph", "transformers-cuda", "head-bench", "evidence"], text
    assert all(len(proves) > 30 for _, _, proves in parts)
    assert sum(int(limit) for _, limit, _ in parts) <= 8 * 60, "the parts' limits fit the 8-minute budget"
    assert text.count("\n  runs: ") == len(parts)


def test_every_test_it_names_exists():
    named = [n for line in _dry_run().splitlines() if line.startswith("  tests: ") for n in line.split()[1:]]
    assert len(named) >= 5
    files = {n.split("::")[0] for n in named}
    assert all((ROOT / f).is_file() for f in files), files
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *named],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = done.stdout
    for node in named:
        assert node in collected, f"{node} is named by gpu_check.sh but not collected"


def test_an_unknown_argument_is_refused():
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dryrun"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and "usage:" in done.stderr
