"""Faults injected into the tiny path's hidden-state extractor (`draftscope.pipeline.stages.hsextract.transformers_extractor.extract`,
the code the hsextract stage runs on a CPU), called directly on a small random Qwen3 with synthetic token rows —
the stage itself needs `prepare`'s dataset and the speculators environment (see test_faults_train.py, which kills
the real stage too). `hs_driver.py` forks the extractor and kills it with SIGKILL or SIGTERM after a seeded number
of new files, at a seeded moment, or between a file's write and its rename; every file presented as final must
load, none seen before may change, and the clean resume must equal an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

pytestmark = pytest.mark.reliability

FAULTS = 20
DRIVER = Path(__file__).with_name("hs_driver.py")


def test_hsextract_faults_then_resume_equals_an_uninterrupted_run(tmp_path, figures, seed):
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), str(seed), str(FAULTS)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    landed = [f for f in report["faults"] if f["landed"]]
    assert len(landed) >= FAULTS - 2, "most kills must land while the extractor runs"
    for f in landed:
        with figures.fault("hsextract", f["what"]) as fault:
            fault.lose(f["lost"])
            fault.tear(len(f["broken"]))  # a file under its final name that does not load whole
            assert not f["broken"] and f["lost"] == 0, f
    final = report["final"]
    with figures.rerun("hsextract", "resume after the kills") as rerun:
        rerun.lose(final["lost"])
        rerun.tear(len(final["broken"]))
        assert final["files"] == final["rows"] and final["skipped"] + final["written"] == final["rows"]
        assert final["differ"] == [], "the resumed files differ from an uninterrupted run"
        assert not list((tmp_path / "hs").glob("*.partial")), "a partial file outlived the resume"
