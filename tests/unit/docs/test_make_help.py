"""`make` alone prints the targets: a newcomer's first `make` must not start a gigabyte of set-up."""

from __future__ import annotations

import re
import subprocess

from support import ROOT

TARGET = re.compile(r"^([a-z][a-z0-9-]*):(?!=)", re.M)


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_alone_prints_every_target_and_runs_nothing():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    body = re.sub(r"^define .*?^endef$", "", text, flags=re.M | re.S)
    targets = set(TARGET.findall(body))
    assert {"demo", "setup", "test", "help"} <= targets
    shown = _make()
    assert shown.returncode == 0, shown.stderr
    listed = set(shown.stdout.split("Every target:", 1)[1].split())
    assert listed == targets
    assert "demo" in shown.stdout.split("Every target:", 1)[0]
    planned = _make("-n")  # what bare `make` would run: the help's printing, nothing installed
    assert planned.returncode == 0 and "pip install" not in planned.stdout and "-m venv" not in planned.stdout


def test_help_names_only_targets_that_exist():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    body = re.sub(r"^define .*?^endef$", "", text, flags=re.M | re.S)
    targets = set(TARGET.findall(body))
    helped = _make().stdout.split("Every target:", 1)[0]
    named = {m.group(1) for m in re.finditer(r"^  ([a-z][a-z0-9-]*)", helped, re.M)}
    assert named and named - targets == set()
