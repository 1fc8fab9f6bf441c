"""Generated hostile values for every option of every command (issue #18): zero tracebacks, zero hangs, zero writes
on refusal, no value reaching a shell. The generator and the driver are in `optfuzz`; each case counts in
`invoke reliability`'s figures as a generated bad input, apart from the named corpus (test_bad_inputs).

Per option: a few values drawn by hypothesis (catalogue, near misses, generated text and numbers; derandomized, no
database, so CI sees the same cases every time), each run in-process under a SIGALRM bound. A handful of cases go
through the real `invoke` command line as well, as a cross-check of the in-process driver.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings

import optfuzz as F
from support import ROOT

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("DRAFTSCOPE_FUZZ_EXAMPLES", "8"))  # generated values per option
# Known failures in code owned elsewhere: (task, option) -> reason. Each is an xfail(strict=True) below, so the
# fix turns it into a failure to remove from this list. Keep it to a handful.
KNOWN: dict[tuple[str, str], str] = {}

SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)

PAIRS = [(task, option) for task in F.tasks() for option in F.options(task)]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> F.World:
    from test_analysis_synthetic import make_run  # tests/unit/analysis, on the path (tests/conftest.py)

    fixtures = tmp_path_factory.mktemp("fuzz-fixtures")
    run, run2 = make_run(fixtures / "run-a"), make_run(fixtures / "run-b", seed=1, speed=0.9)
    prompts = fixtures / "prompts.json"
    prompts.write_bytes((ROOT / "examples" / "prompts.json").read_bytes())
    F.warm(F.World(fixtures, tmp_path_factory.mktemp("warm"), run, run2, prompts))  # lazy imports, unbounded
    return F.World(fixtures, tmp_path_factory.mktemp("fuzz-cases"), run, run2, prompts)


def test_every_option_has_a_kind_and_every_task_a_baseline():
    assert set(F.BASELINES) == set(F.tasks())
    unknown = sorted({o for t in F.tasks() for o in F.options(t)} - set(F.KINDS))
    assert not unknown, f"options with no fuzzing kind (add them to optfuzz.KINDS): {unknown}"
    for task, base in F.BASELINES.items():
        flags = {
            n for a in __import__("draftscope.cli", fromlist=["ns"]).ns[task].get_arguments() for n in a.names
        }
        assert {k for k in base} <= flags, task


def test_every_baseline_is_accepted_cleanly(world, figures):
    """Each task's baseline line passes (so a refusal in a case is the hostile value's doing, not the baseline's),
    except the few whose baseline is refused by design (a missing study, research or run folder; no image has a published digest yet)."""
    refused_by_design = {"evidence.add", "evidence.verify", "recover", "images.pull"}
    bad = []
    for task in F.tasks():
        case = F.run_case(world, task, None, ())
        want = "refused" if task in refused_by_design else "accepted"
        if case.outcome != want:
            bad.append(case.describe())
    assert not bad, "\n".join(bad)


def _record(figures, case: F.Case) -> None:
    figures.generated_case(case.task, case.option or "", case.outcome)


@pytest.mark.parametrize(("task", "option"), PAIRS, ids=[f"{t}--{o}" for t, o in PAIRS])
def test_hostile_option_values(task, option, world, figures, request):
    if (task, option) in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[(task, option)], strict=True))
    failures: list[str] = []

    @SETTINGS
    @given(given_=F.values(option))
    def attempt(given_):
        case = F.run_case(world, task, option, given_)
        _record(figures, case)
        if not case.ok:
            failures.append(case.describe())

    attempt()
    assert not failures, f"{len(failures)} case(s) broke the contract:\n" + "\n".join(failures)


def test_the_task_with_no_option_runs_cleanly(world, figures):
    for task in F.tasks():
        if not F.options(task):
            case = F.run_case(world, task, None, ())
            _record(figures, case)
            assert case.ok, case.describe()


# --- a few through the real command line ----------------------------------------------------------------------------

CROSS = [
    ("bench-overhead", "tokens", "nan"),
    ("head-study", "k", "-5"),
    ("compare", "resamples", str(10**30)),
    ("benchmark", "max_new_tokens", "1e309"),
    ("pipeline", "nodes", "$(touch {canary})"),
    ("validate", "run_dir", "{sb}/loop/x"),
    ("share", "output", "/proc/draftscope-x/b.tar.gz"),
    ("plan", "opts", "repeats=nan"),
]


@pytest.mark.parametrize(("task", "option", "value"), CROSS, ids=[f"{t}--{o}" for t, o, _ in CROSS])
def test_real_command_line_agrees(task, option, value, world, tmp_path, figures):
    """The same contract through `python -m invoke`, in a fresh process (a cross-check of the in-process driver)."""
    cwd = F.make_sandbox(tmp_path)
    words = [world.fill(w, tmp_path) for w in F.argv_for(task, option, (world.fill(value, tmp_path),))]
    before = F.snapshot(tmp_path), F.snapshot(world.fixtures)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(ROOT), *words],
        cwd=cwd,
        env={**os.environ, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    case = F.Case(task, option, (value,), words, code=done.returncode, stderr=done.stderr)
    case.seconds = time.monotonic() - start
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if (tmp_path / F.CANARY).exists():
        case.outcome = "canary"
    elif "Traceback" in done.stderr:
        case.outcome = "traceback"
    elif done.returncode == 0:
        case.outcome = "accepted"
    elif not lines or not lines[-1].startswith("error:"):
        case.outcome = "unclean"
    elif (F.snapshot(tmp_path), F.snapshot(world.fixtures)) != before:
        case.outcome = "wrote"
    else:
        case.outcome = "refused"
    _record(figures, case)
    assert case.outcome == "refused", case.describe()
