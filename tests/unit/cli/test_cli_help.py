"""`invoke TASK --help` and `draftscope TASK --help` print the task's help and exit 0, for every task.

One fresh interpreter per task runs both programs as their scripts do: invoke's own (which loads the checkout's
tasks.py) and `draftscope.cli:main`.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from draftscope.cli import ns

from support import ROOT

# Both programs, each as its script runs it, with `TASK --help` and `TASK -h`: exit codes and output as JSON.
LAUNCHER = """
import contextlib, io, json, sys
from invoke.main import program as invoke_program
from draftscope.cli import main as draftscope_main

task = sys.argv[1]
found = {}
for flag in ("--help", "-h"):
    for name in ("invoke", "draftscope"):
        sys.argv = [name, task, flag]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                invoke_program.run(sys.argv) if name == "invoke" else draftscope_main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        found[f"{name} {flag}"] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(found))
"""

# invoke's parser gives a task's missing positionals the next words and refuses a task that is still short of
# one: with two positionals, `--help` fills the first and the second is missing. `invoke --help TASK` and
# `draftscope TASK --help` work; `invoke TASK --help` exits 1 with invoke's own message.
TWO_POSITIONALS = {"compare"}


def _help(task: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, task],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_known_exceptions_are_exactly_the_tasks_with_two_positionals():
    two = {n for n in ns.task_names if len([a for a in ns[n].get_arguments() if a.positional]) > 1}
    assert two == TWO_POSITIONALS


@pytest.mark.parametrize("task", sorted(ns.task_names))
def test_task_help_exits_0_under_invoke_and_draftscope(task):
    found = _help(task)
    summary = inspect.getdoc(ns[task]).splitlines()[0]
    helped = [a for a in ns[task].get_arguments() if a.help]
    for key, result in found.items():
        binary = key.split()[0]
        if binary == "invoke" and task in TWO_POSITIONALS:
            assert result["code"] == 1, key
            assert "did not receive required positional arguments" in result["err"], key
            continue
        assert result["code"] == 0, f"{key}: {result['err']}"
        usage = "inv[oke]" if binary == "invoke" else "draftscope"
        assert result["out"].startswith(f"Usage: {usage} [--core-opts] {task} "), result["out"][:200]
        assert summary in result["out"], key
        # The options' help is there too (invoke's Task uses a help string up the first time it reads it).
        for arg in helped[:1]:
            assert " ".join(arg.help.split()[:3]) in " ".join(result["out"].split()), key


@pytest.mark.parametrize("task", sorted(ns.task_names))
def test_every_short_flag_is_a_letter_or_a_digit(task):
    # invoke takes the first free character of an option's dashed name: with all its letters taken, the dash.
    for arg in ns[task].get_arguments():
        for flag in arg.names:
            assert len(flag) > 1 or flag.isalnum(), f"{task}: --{arg.name} has the short flag -{flag}"
