"""The floor plan (docs/develop/architecture.md) holds: `.importlinter`'s contracts pass on the tree, and they fail on a copy
with one upward import planted, so a contract that can no longer fail would be noticed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the dev extra)")


def _lint(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [str(LINT), "--no-cache", "--config", str(ROOT / ".importlinter")]
    return subprocess.run(argv, cwd=src, env=env, capture_output=True, text=True, check=False, timeout=300)


def test_the_tree_keeps_every_contract():
    done = _lint(ROOT / "src")
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.count("KEPT") == 6


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        ("core/errors.py", "from draftscope.cli import render", "Core is the ground floor"),
        ("head/policy.py", "from draftscope.pipeline import registry", "The head is a library"),
        ("analysis/stats.py", "from draftscope.bench import plan", "Analysis reads run directories"),
        ("runtime/step.py", "from draftscope.execute import plan", "Layers"),
        ("pipeline/batch/jobs.py", "from draftscope.execute.slurm import script", "Planners hand a launcher"),
    ],
)
def test_a_planted_upward_import_breaks_a_contract(tmp_path, module, planted, broken):
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "draftscope", src / "draftscope", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = src / "draftscope" / module
    # Inside a function, as the old code dodged its cycles: the contracts count it all the same.
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {planted}\n")
    done = _lint(src)
    assert done.returncode != 0
    assert f"{broken}" in done.stdout and "BROKEN" in done.stdout
