"""The demo shows each step's output as it comes (and a line while a step is quiet), keeps it in the step's log,
and on failure prints the log's last lines as lines, not flattened into its one-line error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.progress import TAIL_PREFIX
from draftscope.ops.demo import Demo, Step, run_step
from draftscope.ops.streaming import PREFIX, run_streamed


def test_output_is_streamed_logged_and_quiet_spells_announced(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    said: list[str] = []
    code = run_streamed(
        [sys.executable, "-u", "-c", "import time; print('one'); time.sleep(0.8); print('two')"],
        log,
        say=said.append,
        label="quiet",
        every=0.2,
    )
    assert code == 0
    assert said[0] == PREFIX + "one" and said[-1] == PREFIX + "two"
    assert any("quiet: still running" in line for line in said[1:-1])
    assert log.read_text() == "one\ntwo\n"


def test_a_failed_step_prints_its_log_tail_as_lines(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    demo = Demo(tmp_path, sys.executable)
    script = "import sys; [print(f'line {i}') for i in range(30)]; sys.exit(3)"
    step = Step("broken", "a step that fails", ["-c", script], python=sys.executable)
    said: list[str] = []
    with pytest.raises(UserError) as caught:
        run_step(step, demo, said.append)
    log = tmp_path / "logs" / "broken.log"
    assert said[0] == f"    log: {log}"
    header = said.index(f"last 20 lines of {log}:")
    assert said[header + 1 :] == [f"{TAIL_PREFIX}line {i}" for i in range(10, 30)]
    message = caught.value.render()
    assert "exit 3" in message and "\n" not in message and str(log) in message
    assert not step.ok
