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


@pytest.mark.parametrize("task", sorted(ns.task_names))
def test_task_help_exits_0_under_invoke_and_draftscope(task):
    """Both names print the kit's help: the usage line with the positional arguments in order, the summary, and
    every option with its type and default where it has them — also for a task whose positionals were not given."""
    found = _help(task)
    cmd = ns[task]
    summary = inspect.getdoc(cmd).splitlines()[0]
    positionals = "".join(f" {r.flag}" for r in cmd.table if r.positional)
    for key, result in found.items():
        binary = key.split()[0]
        assert result["code"] == 0, f"{key}: {result['err']}"
        first = result["out"].splitlines()[0]
        assert first.startswith(f"Usage: {binary} {task}") and positionals in first, first
        assert summary in result["out"], key
        text = " ".join(result["out"].split())
        for row in cmd.table:
            assert row.flag in text, f"{key}: {row.flag}"
            if row.kind in (int, float) and not row.positional:
                assert f"{row.flag}={row.value_name}" in text and row.type_text() in text, (
                    f"{key}: {row.flag}"
                )
            if row.default is not None and row.kind is not bool:
                assert f"default: {row.default}" in text, f"{key}: {row.flag}"


def test_config_options_show_the_presets_value_and_name_it():
    text = " ".join(_help("benchmark")["invoke --help"]["out"].split())
    assert (
        "--repeats=INT repeats of every prompt [integer 1–1,000; default: 5 (preset transformers-baseline)]"
        in text
    )
    assert "--device=cuda|cpu" in text and "default: cuda (preset transformers-baseline)" in text


@pytest.mark.parametrize("task", sorted(ns.task_names))
def test_no_option_has_a_short_flag(task):
    # Short flags are not used (invoke picked them per task: -s was --stage, --sort or --seed); a one-letter option
    # name (`-k`) is its only spelling.
    for arg in ns[task].get_arguments():
        for flag in arg.names:
            assert len(flag) > 1 or flag == arg.name, f"{task}: --{arg.name} has the short flag -{flag}"
