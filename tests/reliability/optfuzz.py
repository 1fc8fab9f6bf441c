"""Generated hostile values for every option of every command, and the driver that runs one case in-process.

The generator walks the invoke namespace the kit builds (`draftscope.cli.ns`): every task, every option it declares.
Each option has a kind (`KINDS`: a path, a number, a choice, a comma list, free text); each kind has a catalogue of
hostile values (`CATALOGUE`) and a hypothesis strategy (`values`) that draws from the catalogue and from generated
text or numbers. A case is one command line: the task's `BASELINES` argv (otherwise valid, and bounded: `--dry-run`
where the task has it) with one option replaced by the hostile value, always written `--name=VALUE` so that a value
starting with `-` stays a value.

`run_case` runs the line through the kit's own `Program` in this process (a fresh process per case would cost
~1 s each) and judges it against the contract of issue #18:

- a refusal (non-zero exit) ends with one `error:` line on stderr, no traceback, and nothing written anywhere:
  the case's sandbox (its cwd, $HOME, $TMPDIR, its special files), the shared fixture runs and the checkout;
- an acceptance (exit 0) wrote nothing outside the folder it ran in and the outputs its options name;
- no case runs longer than `BOUND_S` seconds (SIGALRM; the case counts as a hang);
- the canary a shell metacharacter value tries to create never appears.

Real, long work is never started: tasks with `--dry-run` run with it; for the others, the first program the task
would start (`subprocess`), or its in-process work function (`GATES`), raises `ReachedWork`, which counts as an
acceptance — the options were all checked by then.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import strategies as st

from draftscope.cli import ns
from draftscope.cli.program import DraftscopeProgram

from support import ROOT

# Seconds one in-process case may take before it counts as a hang: they take milliseconds; CI runs this tier beside
# the Slurm tier on two cores.
BOUND_S = 10.0
CANARY = "CANARY"

# --- what each option is -------------------------------------------------------------------------------------------

PATH, NUMBER, CHOICE, CSV, TEXT = "path", "number", "choice", "csv", "text"

# Every option of every task, by kind; `test_every_option_has_a_kind` fails when a task gains an option not listed
# here, so a new option is fuzzed from the day it exists.
KINDS: dict[str, str] = {
    # paths (files or folders, read or created)
    **dict.fromkeys(
        (
            "path",
            "run",
            "report",
            "prompts",
            "output",
            "config",
            "workdir",
            "run_dir",
            "base",
            "candidate",
            "comparison",
            "root",
            "train_python",
            "torch_wheel",
            "kernel_sources",
            "file",
            "lock",
            "verdicts",
        ),
        PATH,
    ),
    # numbers (declared as text or as int)
    **dict.fromkeys(
        (
            "tokens",
            "rounds",
            "hidden",
            "repeats",
            "k",
            "group_size",
            "int4_group_size",
            "max_seconds",
            "warmups",
            "memory_fraction",
            "draft_tokens",
            "fixed_tokens",
            "max_new_tokens",
            "capture_head",
            "threshold",
            "resamples",
            "seed",
            "nodes",
            "target_steps",
            "draft_steps",
            "workers",
            "max_prompts",
        ),
        NUMBER,
    ),
    # one of a fixed set of words (or names of presets, images, stages)
    **dict.fromkeys(
        (
            "backend",
            "experiment",
            "preset",
            "device",
            "runtime",
            "executor",
            "dtype",
            "head",
            "stage",
            "engine",
            "tool",
            "name",
            "show",
            "draft",
            "study",
            "dataset",
            "sort",
            "format",
            "claim",
            "release",
        ),
        CHOICE,
    ),
    # comma-separated lists of numbers
    **dict.fromkeys(("vocab", "rows", "fallback"), CSV),
    # free text that reaches a config, a container argv or a Slurm script
    **dict.fromkeys(
        (
            "opts",
            "model",
            "revision",
            "draft_revision",
            "partition",
            "account",
            "qos",
            "cuda_arch",
            "base_image",
            "to",
            "ref",
            "pytest_args",
            "description",
            "tracking_uri",
        ),
        TEXT,
    ),
}

# A case variant or near miss of a valid word, per choice option (unknown words come from the catalogue).
NEAR_MISSES: dict[str, tuple[str, ...]] = {
    "backend": ("TRANSFORMERS", "Vllm", "transformers "),
    "experiment": ("Tiny-CPU", "tiny-cpu.yaml", "../experiments/tiny-cpu"),
    "preset": ("TINY", "tiny.yaml", "../models/tiny"),
    "device": ("CPU", "cuda:0", "cpu "),
    "runtime": ("Local", "DOCKER", "podman "),
    "executor": ("SLURM", "Local", "slurm "),
    "dtype": ("Float32", "fp32", "bf16"),
    "head": ("Dense", "ROWWISE", "prefix "),
    "stage": ("REGEN", "regen,,train", "regen,regen", ",", "all,regen"),
    "engine": ("Docker", "PODMAN", "docker "),
    "tool": ("BUILDX", "Skopeo", "buildx "),
    "name": ("VLLM", "Transformers", "vllm-CPU"),
    "show": ("TINY", "tiny.yaml", "../models/tiny"),
    "draft": ("DFlash", "DFLASH2", "tiny "),
    "study": ("Prefix-Head-CPU", "prefix-head-cpu.yaml", "../studies/prefix-head-cpu"),
    "dataset": ("MT-Bench", "mt-bench.json", "../datasets/mt-bench"),
    "claim": ("Tiny-AA-Tokens-Identical", "held-out-task-quality ", "../claims/x"),
    "sort": ("Request-Tok-S", "request_tok_s", "ttft", "acceptance "),
    # datasets.import's and export's --format
    "format": ("MT-BENCH", "mt_bench", "spec-bench ", "CSV", "Parquet", "csv ", "vllm_bench"),
}

# --- the hostile values ----------------------------------------------------------------------------------------------

# {sb} is the case's sandbox, {canary} the file a shell would create; both are filled in per case.
ANY = (
    "",
    " ",
    "\t\n",
    "x" * 10_000,
    "a\x00b",
    "a\nb",
    "ok\n",
    "a:b",
    "a,b",
    "a=b",
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary}",
    "\udcff\udcfe",  # bytes that are not UTF-8, as Python hands them over (surrogateescape)
    "-",
    "-x",
    "--",
    "nope",
    "é" * 3,
)
PATHS = (
    "../../x",
    "/proc/self/status",
    "/proc/draftscope-x/y",
    "/dev/null",
    "/dev/full",
    "/dev/zero",
    "{sb}/fifo",
    "{sb}/dir",
    "{sb}/dir/",
    "{sb}/file",
    "{sb}/file/x",
    "{sb}/loop",
    "{sb}/loop/x",
    "{sb}/missing/x",
    "{sb}/a:b/x",
    "/",
    ".",
    "~",
)
NUMBERS = (
    "-1",
    "0",
    "-0",
    str(10**30),
    "-" + str(10**30),
    "nan",
    "inf",
    "-inf",
    "1e309",
    "1.5",
    "0x10",
    "1_000",
    "ten",
    " 3 ",
    "3%",
    "1e3",
    "0.0",
)
CSVS = (",", "1,,2", "1,1", "-1", "nan", "1e309", str(10**30), "1,a", " , ", "0", "1;2", "inf,1")
TEXTS = ("key", "=value", "key=", "a.b.c=1", "repeats=nan", "repeats=-1", "k=v=w", "x" * 300)

CATALOGUE: dict[str, tuple[str, ...]] = {
    PATH: ANY + PATHS,
    NUMBER: ANY + NUMBERS,
    CHOICE: ANY + PATHS[:3],
    CSV: ANY + CSVS,
    TEXT: ANY + TEXTS,
}

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
_NUMBER_TEXT = st.one_of(
    st.integers(-(10**40), 10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
_CSV_TEXT = st.lists(st.one_of(st.integers(-(10**6), 10**12).map(str), _TEXT), max_size=4).map(",".join)


def values(option: str) -> st.SearchStrategy[tuple[str, ...]]:
    """One value (or, for a repeatable option, one to three) for `option`: catalogue, near misses, generated."""
    kind = KINDS[option]
    one = st.one_of(
        st.sampled_from(CATALOGUE[kind] + NEAR_MISSES.get(option, ())),
        _TEXT,
        *([_NUMBER_TEXT] if kind == NUMBER else []),
        *([_CSV_TEXT] if kind == CSV else []),
    )
    if option in REPEATABLE:
        return st.lists(one, min_size=1, max_size=3).map(tuple) | one.map(lambda v: (v, v))  # duplicates
    return one.map(lambda v: (v,))


REPEATABLE = {name for task in ns.task_names for name in getattr(ns[task], "iterable", ()) or ()}

# --- the tasks -------------------------------------------------------------------------------------------------------

# Each task's otherwise valid, bounded command line ({run}, {run2}: fixture runs; {sb}: the case's sandbox). A
# hostile value replaces the option it is for (the positionals are given as options, `--path=…`, like the rest).
BASELINES: dict[str, dict[str, str | None]] = {
    "analyze": {"path": "{run}"},
    "bench-overhead": {},
    "benchmark": {
        "backend": "transformers",
        "preset": "tiny",
        "device": "cpu",
        "runtime": "local",
        "prompts": "{prompts}",
        "output": "{sb}/out/run",
        "dry-run": None,
    },
    "datasets.import": {
        "file": str(ROOT / "tests" / "fixtures" / "datasets" / "mt_bench_question.jsonl"),
        "format": "mt-bench",
        "output": "{sb}/out/prompts.json",
    },
    "datasets.list": {},
    "claims.list": {"verdicts": "{sb}/out/verdicts"},
    "claims.reproduce": {"claim": "held-out-task-quality", "verdicts": "{sb}/out/verdicts"},
    "kick-the-tires": {"verdicts": "{sb}/out/verdicts"},
    "contracts.diff": {"release": "vllm==1.0"},
    "compare": {"base": "{run}", "candidate": "{run2}", "output": "{sb}/out/cmp.json", "resamples": "200"},
    "demo": {"dry-run": None},
    "doctor": {},
    "evidence.add": {"path": "{run}", "study": "draftscope-fuzz-no-study", "root": "{sb}/research"},
    "evidence.verify": {"root": "{sb}/research"},
    "export": {"path": "{run}", "format": "csv", "output": "{sb}/out/rows.csv"},
    "head-bench": {},
    "head-study": {"run": "{run}"},
    "images.build": {"name": "transformers", "dry-run": None},
    "images.list": {},
    "images.lock": {"check": None},
    "images.pull": {"name": "vllm", "dry-run": None},
    "images.push": {"name": "vllm", "to": "registry.invalid/ns/repo", "dry-run": None},
    "images.sbom": {"name": "transformers", "dry-run": None},
    "pipeline": {"preset": "tiny", "runtime": "local", "workdir": "{sb}/out/w", "dry-run": None},
    "plan": {"experiment": "tiny-cpu"},
    "presets": {},
    "recover": {"run-dir": "{sb}/dir"},
    "reliability": {},
    "reproduce": {"run": "{run}", "output": "{sb}/out/again"},
    "share": {"run": "{run}", "output": "{sb}/out/b.tar.gz"},
    "tiny.build": {},
    "validate": {"run-dir": "{run}"},
    "version": {},
}

# Names of options that name what a command creates: an accepted case may write there (and in its cwd).
OUTPUTS = ("output", "report", "workdir", "comparison", "verdicts")

# In-process work functions: reaching one means every option was checked (the gate raises ReachedWork).
GATES = (
    "draftscope.tiny.load_tokenizer",  # bench-overhead: the tiny models load first
    "draftscope.tiny.build",  # tiny.build: training
    "draftscope.head.bench._torch",  # head-bench: the timed kernels
    "draftscope.ops.contracts.wheels.release_wheel",  # contracts.diff: a wheel from the cache or the index
    "draftscope.ops.kick.kick",  # kick-the-tires: builds nothing, pushes and runs every claim
    "draftscope.head.study.study",  # head-study: the replay
)

# Programs a case may really start (fast, read-only); any other raises ReachedWork before it starts.
ALLOWED_PROGRAMS = ("git",)


def tasks() -> list[str]:
    return sorted(ns.task_names)


def options(task: str) -> list[str]:
    """The task's options that take a value, by their Python name."""
    return [a.name for a in ns[task].get_arguments() if a.kind is not bool]


def flag(option: str) -> str:
    """How the command line names `option`: `--dashed-name`, or `-k` for a one-letter option (invoke has no `--k`)."""
    dashed = option.replace("_", "-")
    return f"-{dashed}" if len(dashed) == 1 else f"--{dashed}"


def argv_for(task: str, option: str | None, given: tuple[str, ...]) -> list[str]:
    """The task's baseline with `option` set to `given` (one `--name=VALUE` per value)."""
    words = [task]
    skip = option.replace("_", "-") if option else None
    for name, value in BASELINES[task].items():
        if name == skip:
            continue
        words.append(flag(name) if value is None else f"{flag(name)}={value}")
    if option is not None:
        words += [f"{flag(option)}={value}" for value in given]
    return words


# --- one case --------------------------------------------------------------------------------------------------------


class ReachedWork(BaseException):
    """A gate was reached: the command would start its real work now."""


class Hang(BaseException):
    """The case ran past BOUND_S."""


@dataclass
class Case:
    task: str
    option: str | None
    given: tuple[str, ...]
    argv: list[str]
    outcome: str = ""  # refused | accepted | traceback | hang | wrote | unclean | canary
    detail: str = ""
    code: int | None = None
    stderr: str = ""
    seconds: float = 0.0
    changed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome in ("refused", "accepted")

    def describe(self) -> str:
        shown = [v if len(v) < 80 else v[:60] + f"...({len(v)} chars)" for v in self.given]
        return (
            f"{self.task} --{(self.option or '').replace('_', '-')}={shown!r}: {self.outcome}"
            f" ({self.detail}) exit={self.code} stderr={self.stderr[-600:]!r}"
        )


# Folders of a working checkout that can hold many large files: only their entries are watched.
SHALLOW = {"runs", "comparisons", ".wheels"}
SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "node_modules",
    ".mypy_cache",
}


def snapshot(top: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry under `top` (links not followed): mode, size, mtime. Cheap enough to take around every case."""
    found: dict[str, tuple[int, int, int]] = {}
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        names = (*dirs, *files)
        if os.path.dirname(folder) == str(top) and os.path.basename(folder) in SHALLOW:
            dirs[:] = []  # a new entry is seen; what lies inside an old one is not walked (runs can be large)
        for name in names:
            path = os.path.join(folder, name)
            try:
                st_ = os.lstat(path)
            except OSError:
                continue
            # A folder's own size and time change with its entries, which are listed themselves.
            found[path] = (
                (st_.st_mode, 0, 0)
                if os.path.isdir(path) and not os.path.islink(path)
                else (
                    st_.st_mode,
                    st_.st_size,
                    st_.st_mtime_ns,
                )
            )
    return found


def make_sandbox(folder: Path) -> Path:
    """A case's own folder: its cwd two levels down (so `../../x` stays inside), $HOME, $TMPDIR and the special
    files the hostile paths name: a named pipe, a folder, a file, a symbolic link loop."""
    (folder / "a" / "b" / "cwd").mkdir(parents=True)
    (folder / "home").mkdir()
    (folder / "tmp").mkdir()
    (folder / "dir").mkdir()
    (folder / "file").write_text("x\n")
    (folder / "out").mkdir()
    os.mkfifo(folder / "fifo")
    os.symlink(folder / "loop", folder / "loop")
    return folder / "a" / "b" / "cwd"


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def fire(signum, frame):
        raise Hang

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, fire)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:  # pytest-timeout's own alarm, minus the time this case took
            signal.setitimer(
                signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 0.01), old_interval
            )


def _bounded(seconds: float | None) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if seconds is None else _alarm(seconds)


@contextlib.contextmanager
def _gated() -> Iterator[None]:
    """subprocess and the GATES raise ReachedWork instead of starting work."""
    import importlib

    saved = []
    real_child = subprocess.Popen._execute_child

    def execute_child(self, args, executable, *rest, **kw):
        program = os.path.basename(str(executable or (args[0] if isinstance(args, list | tuple) else args)))
        if program in ALLOWED_PROGRAMS:
            return real_child(self, args, executable, *rest, **kw)
        raise ReachedWork(f"would run {program}")

    subprocess.Popen._execute_child = execute_child  # type: ignore[method-assign]
    try:
        for dotted in GATES:
            module_name, attr = dotted.rsplit(".", 1)
            module = importlib.import_module(module_name)
            saved.append((module, attr, getattr(module, attr)))

            def gate(*args, _what=dotted, **kwargs):
                raise ReachedWork(f"reached {_what}")

            setattr(module, attr, gate)
        yield
    finally:
        subprocess.Popen._execute_child = real_child  # type: ignore[method-assign]
        for module, attr, original in saved:
            setattr(module, attr, original)


def _stream(errors: str) -> io.TextIOWrapper:
    # As a real process's: UTF-8, strict on stdout (a lone surrogate there is a traceback), backslashes on stderr.
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]


@dataclass
class World:
    """What every case shares: the fixture runs (read by cases, never written) and the checkout."""

    fixtures: Path
    cases: Path
    run: Path
    run2: Path
    prompts: Path
    counter: int = 0

    def fill(self, text: str, sandbox: Path) -> str:
        return (
            text.replace("{sb}", str(sandbox))
            .replace("{canary}", str(sandbox / CANARY))
            .replace("{run2}", str(self.run2))
            .replace("{run}", str(self.run))
            .replace("{prompts}", str(self.prompts))
        )


WARM = ("benchmark", "pipeline", "validate", "compare", "share", "head-study", "analyze", "plan", "presets")


def warm(world: World) -> None:
    """Run the baselines of the tasks whose first run imports much (numpy, scipy, matplotlib and its font cache,
    the stage registry), outside any judged case and with no time bound: a cold import is not a hang, and an import
    cut short by the bound would leave a half-made module behind for every later case (a loaded machine once took
    over 10 s to import scipy.stats)."""
    for task in WARM:
        run_case(world, task, None, (), bound=None)
    world.counter = 0


def run_case(
    world: World, task: str, option: str | None, given: tuple[str, ...], *, bound: float | None = BOUND_S
) -> Case:
    world.counter += 1
    sandbox = world.cases / f"c{world.counter}"
    sandbox.mkdir()
    cwd = make_sandbox(sandbox)
    filled = tuple(world.fill(v, sandbox) for v in given)
    case = Case(task, option, given, [world.fill(w, sandbox) for w in argv_for(task, option, filled)])
    watched = (sandbox, world.fixtures, ROOT)
    before = {top: snapshot(top) for top in watched}
    out, err = _stream("strict"), _stream("backslashreplace")
    # matplotlib's font cache lives outside the watched folders: built once, not once per case
    env = {
        "HOME": str(sandbox / "home"),
        "TMPDIR": str(sandbox / "tmp"),
        "MPLCONFIGDIR": str(world.cases / "mpl"),
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved_cwd, saved_argv = os.getcwd(), sys.argv
    start = time.monotonic()
    tempfile.tempdir = None
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["draftscope", *case.argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _gated(), _bounded(bound):
            DraftscopeProgram(namespace=ns, name="draftscope", binary="draftscope").run(sys.argv)
        case.code, case.outcome = 0, "accepted"
    except SystemExit as exc:
        case.code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        case.outcome = "accepted" if case.code == 0 else "refused"
    except ReachedWork as exc:
        case.code, case.outcome, case.detail = 0, "accepted", str(exc)
    except Hang:
        case.outcome, case.detail = "hang", f"still running after {BOUND_S:.0f} s"
    except BaseException as exc:
        case.outcome = "traceback"
        case.detail = f"{type(exc).__name__}: {str(exc)[:300]}"
        err.write("".join(traceback.format_exception(exc))[-3000:])
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
    case.seconds = time.monotonic() - start
    case.stderr = _text(err)
    _judge(case, world, sandbox, cwd, before)
    shutil.rmtree(sandbox, ignore_errors=True)
    return case


def _judge(case: Case, world: World, sandbox: Path, cwd: Path, before: dict) -> None:
    changed = []
    for top, seen in before.items():
        now = snapshot(top)
        changed += sorted(p for p in seen.keys() | now.keys() if seen.get(p) != now.get(p))
    case.changed = changed
    if (sandbox / CANARY).exists():
        case.outcome, case.detail = "canary", "a value reached a shell"
        return
    if case.outcome == "refused":
        lines = [line for line in case.stderr.splitlines() if line.strip()]
        if (
            case.option and f"No idea what '{flag(case.option)}" in case.stderr
        ):  # the driver's mistake, not a refusal
            raise AssertionError(f"{case.task}: the parser does not know {flag(case.option)}: {case.stderr}")
        if "Traceback" in case.stderr:
            case.outcome, case.detail = "traceback", "a traceback on stderr"
        elif not lines or not lines[-1].startswith("error:"):
            case.outcome, case.detail = "unclean", "the last stderr line is not `error: …`"
        elif changed:
            case.outcome, case.detail = "wrote", f"refused but changed {changed[:5]}"
    elif case.outcome == "accepted":
        allowed = [str(cwd)]
        for word in case.argv:
            name, _, value = word.partition("=")
            if name.lstrip("-").replace("-", "_") in OUTPUTS and value:
                allowed.append(os.path.abspath(os.path.join(cwd, value)))
        outside = [
            p for p in changed if not any(p == a or p.startswith(a.rstrip("/") + "/") for a in allowed)
        ]
        # The folders that hold the declared outputs change (a new entry) when an output is created.
        outside = [p for p in outside if not any(a.startswith(p + "/") for a in allowed)]
        if outside:
            case.outcome, case.detail = "wrote", f"accepted but changed {outside[:5]}"
