"""One error handler for every entry point (`draftscope.core.errors`): a user error is one line and exit 2, running
out of memory one line and exit 3, a bug its traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from invoke import Exit

from draftscope.core.errors import UserError, exit_status, run_main


class OutOfMemoryError(RuntimeError):
    """torch's CUDA out-of-memory error is matched by its type's name (core imports no torch)."""


def _raise(exc: BaseException):
    def body() -> int:
        raise exc

    return body


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (UserError("bad", field="--x", value=3, fix="do y"), 2, "error: --x: bad (got 3); fix: do y"),
        (MemoryError("no room"), 3, "error: out of host memory: no room"),
        (
            OutOfMemoryError("CUDA out of memory. Tried\nmore"),
            3,
            "error: out of GPU memory: CUDA out of memory. Tried",
        ),
        (OutOfMemoryError(""), 3, "error: out of GPU memory: "),
    ],
)
def test_an_expected_failure_is_one_line_and_its_exit_code(exc, code, line, capsys):
    assert exit_status(exc) == (code, line)
    assert run_main(_raise(exc)) == code
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("exc", [ValueError("a bug"), KeyboardInterrupt()])
def test_anything_else_propagates(exc):
    assert exit_status(exc) is None
    with pytest.raises(type(exc)):
        run_main(_raise(exc))


def test_run_main_returns_the_bodys_code():
    assert run_main(lambda: None) == 0
    assert run_main(lambda code: code, 5) == 5


def test_a_task_body_turns_them_into_invokes_exit():
    from draftscope.cli.handler import exits

    def fails(what="user"):
        with exits():
            raise {"user": UserError("bad"), "memory": MemoryError("full"), "bug": ValueError("bug")}[what]

    with pytest.raises(Exit) as user:
        fails()
    assert (user.value.code, user.value.message) == (2, "error: bad")
    with pytest.raises(Exit) as memory:
        fails(what="memory")
    assert (memory.value.code, memory.value.message) == (3, "error: out of host memory: full")
    with pytest.raises(ValueError):
        fails(what="bug")


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "draftscope", "fetch", "--cache", "c", "--repo", "o/n", "--revision", "main"],
        ["-m", "draftscope.pipeline", "exec", "regen"],
        [
            "-m",
            "draftscope.pipeline.batch",
            "run-step",
            "--plan",
            "/nonexistent/plan.json",
            "--stage",
            "regen",
        ],
    ],
    ids=["draftscope", "pipeline", "slurm"],
)
def test_in_container_entry_points_exit_2_with_one_line(argv, tmp_path):
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in done.stderr
