"""Every command block of the README works as printed, in a new shell, after the set-up command.

A newcomer copies the README's blocks into a terminal one at a time: a fresh login shell that has never seen the
kit's environments (`bash -lc` with a clean environment: PATH without any venv), in the checkout. This test does
the same in a copy of the working tree: the block marked `<!-- readme-test: setup -->` first (`make demo`: it sets
up the CPU environment and runs the whole kit), then every other ```sh block in order, each in its own new shell,
for real. A block that needs a GPU is printed with `--dry-run` in the README (it runs as printed on a CPU) or marked
`<!-- readme-test: dry-run -->`, and then each `invoke` command in it gets `--dry-run` here. Any block that exits
non-zero fails the test, with its output.

Marked `vllm` as well as `integration` and `slow`: a block runs vLLM's real CPU engine, which lives in the CPU
environment (.venv-train), so it runs where that environment is built: `make test-vllm` (CI, after the
environment). The copy links `.venv-train` to the checkout's; the checkout's is brought up to date first
(`make train-env`, nothing when it is), so the set-up in the copy never re-installs into it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import ROOT

README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*([\w-]+)\s*-->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
MODES = ("run", "setup", "dry-run")
# A login shell as a new user gets it: no venv on PATH, no variable of this test run.
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Block:
    line: int  # where the block starts in the README (1-based)
    mode: str
    text: str


def blocks(markdown: str) -> list[Block]:
    """The ```sh blocks, each with the mode its `<!-- readme-test: MODE -->` line (just above) gives it."""
    found = []
    for m in FENCE.finditer(markdown):
        if m.group(1) not in ("sh", "bash", "shell"):
            continue
        before = markdown[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        mode = marker.group(1) if marker else "run"
        if mode not in MODES:
            raise ValueError(
                f"README line {markdown[: m.start()].count(chr(10))}: unknown readme-test mode {mode!r}"
            )
        found.append(Block(markdown[: m.start()].count("\n") + 1, mode, m.group(2)))
    return found


def as_dry_run(script: str) -> str:
    """Each `invoke …` / `draftscope …` command (continuation lines joined) with `--dry-run` added."""
    out = []
    for command in script.replace("\\\n", " ").splitlines():
        words = command.split("#", 1)[0].split()
        if words and words[0] in ("invoke", "draftscope") and "--dry-run" not in words:
            command = " ".join(words) + " --dry-run"
        out.append(command)
    return "\n".join(out) + "\n"


def script_for(block: Block) -> str:
    return as_dry_run(block.text) if block.mode == "dry-run" else block.text


def clean_env() -> dict[str, str]:
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": CLEAN_PATH, "LANG": "C.UTF-8", "TERM": "dumb"}
    return env


def new_shell(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`script` in a new login shell (bash -lc), stopping at the first failing command."""
    return subprocess.run(
        ["bash", "-lc", "set -e\n" + script],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def working_tree_copy(dest: Path) -> Path:
    """The checkout's files as a fresh clone of this working tree would have them (tracked and untracked, not
    ignored), modification times kept so that make sees the environments as up to date."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


# --- the reading of the README (fast) ---------------------------------------------------------------------------


def test_the_readme_has_a_setup_block_and_commands_after_it():
    found = blocks(README.read_text(encoding="utf-8"))
    assert [b.mode for b in found].count("setup") == 1, "mark the set-up command <!-- readme-test: setup -->"
    assert len(found) >= 3 and all(b.text.strip() for b in found)


def test_marks_are_read_and_a_dry_run_block_gets_dry_run():
    text = (
        "x\n<!-- readme-test: dry-run -->\n```sh\n. env/bin/activate\ninvoke benchmark --a 1 \\\n    --b 2\n```\n"
        "```sh\ninvoke plan\n```\n```python\nprint()\n```\n"
    )
    first, second = blocks(text)
    assert (first.mode, second.mode, first.line) == ("dry-run", "run", 3)
    assert script_for(first) == ". env/bin/activate\ninvoke benchmark --a 1 --b 2 --dry-run\n"
    assert script_for(second) == "invoke plan\n"
    with pytest.raises(ValueError, match="unknown readme-test mode 'maybe'"):
        blocks("<!-- readme-test: maybe -->\n```sh\nls\n```\n")


def test_the_new_shell_has_no_venv_on_path(tmp_path):
    # The point of the test below: a shell that already had the kit's invoke would hide a missing activation.
    result = new_shell('echo "$PATH"; command -v invoke || true', tmp_path, 30)
    assert result.returncode == 0, result.stderr
    assert ".venv" not in result.stdout and str(ROOT) not in result.stdout


# --- the README run as printed (slow: the demo, then a Transformers and a vLLM benchmark on the CPU) ----------------


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(2400)
def test_every_readme_block_works_as_printed_in_a_new_shell(tmp_path):
    # The checkout's environment first, where it lives: the copy's set-up then finds it up to date.
    env = subprocess.run(
        ["make", "train-env"], cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False
    )
    assert env.returncode == 0, env.stdout[-3000:] + env.stderr[-3000:]
    tree = working_tree_copy(tmp_path / "checkout")
    (tree / ".venv-train").symlink_to(ROOT / ".venv-train")
    found = blocks(README.read_text(encoding="utf-8"))
    order = [b for b in found if b.mode == "setup"] + [b for b in found if b.mode != "setup"]
    failed, took = [], []
    for block in order:
        start = time.monotonic()
        result = new_shell(script_for(block), tree, 1500 if block.mode == "setup" else 600)
        took.append(f"README line {block.line} ({block.mode}): {time.monotonic() - start:.0f} s")
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-4000:]
            failed.append(
                f"README line {block.line} ({block.mode}), exit {result.returncode}:\n{block.text}{output}"
            )
    print("\n".join(took))
    assert failed == [], "README blocks that do not work as printed:\n\n" + "\n\n".join(failed)
