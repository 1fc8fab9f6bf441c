"""A container ended for memory is named as such (issue 33, item 5): the engine's `State.OOMKilled`, or exit code
137 (128 + SIGKILL, what the OOM killer sends), make the step's reason "out of memory" with the container's memory
limit and the setting that raises it; any other exit keeps the generic reason with the log's tail. The real engine's
case is tests/container/test_engine_runs.py (a tiny run over a 96m limit)."""

from __future__ import annotations

import pytest

from draftscope.runtime.base import OOM_EXIT, outcome_from_exit
from draftscope.runtime.step import Limits, Step

STEP = Step(name="benchmark", image="transformers", argv=("python",), limits=Limits("3g", 4096, "1g"))


@pytest.mark.parametrize("oom, code", [(True, 137), (True, 1), (False, OOM_EXIT)])
def test_oom_killed_or_137_in_a_container_is_out_of_memory_naming_the_limit(tmp_path, oom, code):
    log = tmp_path / "benchmark.log"
    log.write_text("loading the model\n")
    outcome = outcome_from_exit(STEP, code, 2.0, log, "ds-run-benchmark", oom_killed=oom)
    assert outcome.status == "failed" and outcome.exit_code == code
    reason = outcome.reason or ""
    assert reason.startswith("out of memory: step 'benchmark' hit its container's memory limit of 3g"), reason
    assert "fix: raise the limit with --opts container.memory=SIZE" in reason
    assert ("OOM killer ended it" in reason) is oom


@pytest.mark.parametrize("code", [1, 7, 139, -9])
def test_other_exits_keep_the_generic_reason(tmp_path, code):
    log = tmp_path / "benchmark.log"
    log.write_text("Traceback: boom\n")
    outcome = outcome_from_exit(STEP, code, 2.0, log, "ds-run-benchmark")
    assert outcome.reason is not None and not outcome.reason.startswith("out of memory")
    assert f"exited with code {code}" in outcome.reason and "boom" in outcome.reason


def test_a_local_step_or_the_engines_own_failure_is_not_called_out_of_memory(tmp_path):
    # Exit 137 of a local process is a code the process chose; the engine's client exiting 137 is not the step.
    assert not outcome_from_exit(STEP, OOM_EXIT, 1.0, None, None).reason.startswith("out of memory")
    engine = outcome_from_exit(STEP, OOM_EXIT, 1.0, None, "c", what="the container engine")
    assert not engine.reason.startswith("out of memory")
