"""`invoke reliability`: run the fault-injection suite and print its figures (draftscope.ops.reliability)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from invoke import Exit

from draftscope.cli.command import command
from draftscope.core import settings
from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.options import Option, OptionTable
from draftscope.core.resources import repo_root
from draftscope.ops.reliability import DEFAULT_SEED, FIGURES_ENV, SEED_ENV, Figures, seed_from_env

# --- the task ---------------------------------------------------------------------------------------------------

RELIABILITY = OptionTable.of(
    Option(
        "seed", "seed for the random kill points", kind=int, default_text=f"${SEED_ENV}, else {DEFAULT_SEED}"
    ),
    Option("pytest_args", "extra pytest arguments, e.g. '-x' or '-k benchmark'", metavar="ARGS"),
    Option(
        "workers",
        "pytest-xdist workers, a test file each at a time (0: one process); their tallies are merged",
        kind=int,
        minimum=0,
        maximum=64,
        default=2,
    ),
)


@command(table=RELIABILITY)
def reliability(c, **values):
    """Inject faults and hostile inputs into real runs; print the figures.

    Inject faults (kills, a full disk, concurrent runs), try the bad-input corpus and generated hostile values for
    every option of every command, search outputs for a planted secret; print faults injected/survived, bad inputs
    tried/refused (named and generated apart), records lost, torn lines, secrets found."""
    root = repo_root()
    if root is None or not (root / "tests" / "reliability").is_dir():
        raise UserError("the reliability suite lives in the kit's checkout", fix="run it from a git checkout")
    seed, spread, pytest_args = values["seed"], values["workers"], values["pytest_args"] or ""
    chosen = seed_from_env() if seed is None else seed
    with tempfile.TemporaryDirectory(prefix="draftscope-reliability-") as tmp:
        out = Path(tmp) / "figures.json"
        env = settings.child_env({FIGURES_ENV: str(out), SEED_ENV: str(chosen)})
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "reliability",
            "tests/reliability",
            "-q",
            "-p",
            "no:cacheprovider",
            *(["-n", str(spread), "--dist", "loadfile"] if spread else []),
            *shlex.split(pytest_args),
        ]
        print(f"reliability suite, seed {chosen}: {shlex.join(argv[1:])}", flush=True)
        code = subprocess.run(argv, cwd=root, env=env, check=False).returncode
        if not out.is_file():
            raise Exit(f"the suite wrote no figures (pytest exit code {code})", code=code or 1)
        figures = Figures.from_dict(read_json(out, expect=dict))
    print("\n".join(["== reliability figures", *figures.lines()]))
    extra = shlex.split(pytest_args)
    selected = any(a.startswith("-k") or "::" in a or a.startswith("tests") for a in extra)
    short = [] if selected else figures.shortfalls()  # a selection of tests cannot meet the totals
    if code != 0 or short:
        raise Exit(
            "reliability: " + "; ".join([*short, *([f"pytest exit code {code}"] if code else [])]), code=1
        )
    print(f"reliability: every bound met (rerun these kill points with --seed {chosen})")


RELIABILITY_TASKS = [reliability]
