"""core/settings.py is the one reader of the environment: every variable named once, typed, documented.

A scan of `src/` (the syntax tree, so an alias or a `from os import environ` is caught as well as `os.environ`)
refuses any other direct use of the environment, except the listed exceptions, each with its reason; a planted use
in a copy of the tree proves that the scan can fail. The typed accessors are tried with generated hostile values:
a bad value is always the one-line UserError naming the variable, never another exception. docs/settings.md is
generated from the registry and must equal it.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import io
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftscope import __main__ as entry
from draftscope.core import settings as S
from draftscope.core.errors import UserError

from support import ROOT

SRC = ROOT / "src"
HOME = "draftscope/core/settings.py"  # the one module that reads the environment itself

# Modules still reading the environment directly, each with its reason. A pattern that no longer excuses any use
# must go (test_every_exception_still_excuses_a_use). The Slurm launcher's variables will be declared, with
# `settings.declare`, in `execute/slurm/env.py`, which then reads through them like every other module.
SLURM = "Slurm launcher: being moved (issue #32)"
ALLOWED: dict[str, str] = {}

# What `os` (and its platform twins) offers to read or change the environment.
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})
OS_MODULES = frozenset({"os", "posix", "nt"})


def env_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for every direct use of the environment in `source`: `os.environ` / `os.getenv` / `os.putenv`
    / `os.unsetenv` under any alias of the module, `from os import environ` (any alias, or `*`) and every later use
    of that name, and `getattr(os, "environ")`. A parameter that happens to be called `environ` is not one."""
    tree = ast.parse(source)
    modules: set[str] = set()
    names: set[str] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root in OS_MODULES and not (alias.asname and "." in alias.name):
                    modules.add(alias.asname or root)  # `import os.path` binds `os` as well
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in OS_MODULES:
            for alias in node.names:
                if alias.name in ENV_NAMES or alias.name == "*":
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                    names.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in modules and node.attr in ENV_NAMES:
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in names:
            found.append((node.lineno, node.id))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in modules
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in ENV_NAMES
        ):
            found.append((node.lineno, f"getattr({node.args[0].id}, {node.args[1].value!r})"))
    return sorted(set(found))


def scan(src: Path) -> dict[str, list[tuple[int, str]]]:
    """Every module under `src` that uses the environment directly, by its path relative to `src`."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        uses = env_uses(path.read_text(encoding="utf-8"))
        if uses:
            out[path.relative_to(src).as_posix()] = uses
    return out


@functools.cache
def scan_tree() -> dict[str, list[tuple[int, str]]]:
    """The scan of this tree's src/ (the tests below share it)."""
    return scan(SRC)


def excused(module: str) -> bool:
    return module == HOME or any(fnmatch.fnmatch(module, pattern) for pattern in ALLOWED)


def violations(src: Path | None = None) -> list[str]:
    return [
        f"{module}:{line}: {what}"
        for module, uses in (scan_tree() if src is None else scan(src)).items()
        if not excused(module)
        for line, what in uses
    ]


# --- the scan -----------------------------------------------------------------------------------------------------


def test_only_settings_reads_the_environment():
    found = violations()
    assert found == [], (
        "read the environment through draftscope.core.settings (declare the variable there, then "
        "VARIABLE.get() / .raw(); child processes: settings.child_env / settings.named), or add the module to "
        "ALLOWED with its reason:\n" + "\n".join(found)
    )


def test_the_settings_module_is_the_reader():
    assert HOME in scan_tree()


def test_every_exception_still_excuses_a_use():
    used = [module for module in scan_tree() if module != HOME]
    stale = [p for p in ALLOWED if not any(fnmatch.fnmatch(m, p) for m in used)]
    assert stale == [], f"these exceptions excuse nothing any more: remove them from ALLOWED: {stale}"


def test_every_exception_has_a_reason():
    assert all(reason.strip() for reason in ALLOWED.values())


@pytest.mark.parametrize(
    "source",
    [
        "import os\nx = os.environ['X']\n",
        "import os\nx = os.environ.get('X')\n",
        "import os\nenv = dict(os.environ)\n",
        "import os\nenv = os.environ.copy()\n",
        "import os\nenv = {**os.environ, 'A': '1'}\n",
        "import os as o\nx = o.getenv('X')\n",
        "import os.path\nx = os.environ.get('X')\n",
        "import os\nos.putenv('X', '1')\n",
        "import os\nos.unsetenv('X')\n",
        "def f():\n    import os\n\n    return os.getenv('X')\n",
        "from os import environ\nx = environ['X']\n",
        "from os import environ as e\nx = e['X']\n",
        "from os import getenv\nx = getenv('X')\n",
        "from os import putenv as p\n",
        "from os import *\n",
        "import os\nx = getattr(os, 'environ')\n",
        "import posix\nx = posix.environ\n",
    ],
)
def test_the_scan_sees_every_spelling(source):
    assert env_uses(source), source


@pytest.mark.parametrize(
    "source",
    [
        "def f(environ):\n    return environ.get('X')\n",
        "import os\nx = os.path.join('a', 'b')\n",
        "from os import path\n",
        "x = 'os.environ'\n",
        "import os.path as p\nx = p.join('a')\n",
        "from draftscope.core import settings\nx = settings.HOME.raw()\n",
    ],
)
def test_the_scan_leaves_what_is_not_the_environment(source):
    assert env_uses(source) == []


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        ("core/errors.py", "import os\n\n_PLANTED = os.environ.get('DRAFTSCOPE_PLANTED')\n"),
        ("head/policy.py", "from os import getenv as _g\n\n_PLANTED = _g('DRAFTSCOPE_PLANTED')\n"),
        ("ops/kick.py", "\n\ndef _planted():\n    import os\n\n    return dict(os.environ)\n"),
    ],
)
def test_a_planted_use_in_a_copy_fails_the_scan(tmp_path, module, planted):
    src = tmp_path / "src"
    shutil.copytree(SRC / "draftscope", src / "draftscope", ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(src) == []
    target = src / "draftscope" / module
    target.write_text(target.read_text(encoding="utf-8") + "\n" + planted, encoding="utf-8")
    found = violations(src)
    assert found and all(f.startswith(f"draftscope/{module}:") for f in found), found


def test_a_use_in_the_slurm_launcher_fails_the_scan_too(tmp_path):
    src = tmp_path / "src"
    for module in ("draftscope/execute/slurm/planted.py", "draftscope/core/settings.py"):
        (src / module).parent.mkdir(parents=True, exist_ok=True)
        (src / module).write_text("import os\n\nX = os.environ.get('SLURM_JOB_ID')\n", encoding="utf-8")
    assert violations(src) == ["draftscope/execute/slurm/planted.py:3: os.environ"]


# --- the registry -------------------------------------------------------------------------------------------------


def test_every_variable_is_declared_once_with_a_doc_and_an_audience():
    found = S.variables()
    assert len({v.name for v in found}) == len(found)
    for v in found:
        assert v.doc.strip() and v.audience in S.AUDIENCES, v
        assert v.name == v.name.strip() and " " not in v.name


def test_declaring_a_name_again_differently_is_refused(monkeypatch):
    monkeypatch.setattr(S, "_REGISTRY", dict(S._REGISTRY))
    again = S.Variable(S.DRAFTSCOPE_PRESETS.name, "another doc", "user", owner="draftscope.elsewhere")
    with pytest.raises(ValueError, match="declared twice"):
        S.declare(again)
    assert S.declare(S.DRAFTSCOPE_PRESETS) is S.DRAFTSCOPE_PRESETS  # a module imported again


def test_a_domain_module_declares_its_own_and_the_page_lists_it(monkeypatch):
    monkeypatch.setattr(S, "_REGISTRY", dict(S._REGISTRY))
    job = S.declare(
        S.Variable(
            "EXAMPLE_JOB_ID", "the job's id, set by the scheduler", "upstream", owner="draftscope.x.env"
        )
    )
    assert job in S.variables() and S.lookup("EXAMPLE_JOB_ID") is job
    assert (
        "| `EXAMPLE_JOB_ID` | text | — | the job's id, set by the scheduler (declared in `draftscope.x.env`) |"
        in (S.markdown())
    )


def test_core_settings_names_no_slurm_variable():
    # Slurm's variables stay with the Slurm launcher (execute/), declared there.
    assert "SLURM_" not in (SRC / HOME).read_text(encoding="utf-8")
    assert not [v for v in S.variables() if v.name.startswith("SLURM_") and v.owner == S.__name__]


def test_every_module_that_declares_is_imported_for_the_page():
    declaring = set()
    for path in sorted((SRC / "draftscope").rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        if path.relative_to(SRC).as_posix() == HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = node.func if isinstance(node, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr == "declare") or (
                isinstance(func, ast.Name) and func.id == "declare"
            ):
                declaring.add(module)
    assert declaring <= set(entry.SETTINGS_MODULES), "add these to draftscope.__main__.SETTINGS_MODULES"


def test_settings_imports_nothing_of_the_kit_but_errors():
    tree = ast.parse((SRC / HOME).read_text(encoding="utf-8"))
    kit = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftscope")
    }
    kit |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("draftscope")
    }
    assert kit == {"draftscope.core.errors"}


def test_every_name_the_runtimes_pass_or_set_is_declared():
    from draftscope.head import vllm_switch
    from draftscope.runtime import base, container, local, step

    names = {
        *base.ENV_ALLOW,
        *step.CREDENTIALS,
        *container.HOME_ENV,
        *(v.name for v in local.LOCAL_BASE),
        *(v.name for v in vllm_switch.TUNING),
    }
    missing = sorted(n for n in names if n not in {v.name for v in S.variables()})
    assert missing == []


def _planned_env_names() -> set[str]:
    from draftscope.bench.plan import plan_benchmark
    from draftscope.core.presets import experiment_preset_names, load_experiment, model_preset_names
    from draftscope.pipeline import plan as planning
    from draftscope.pipeline import registry
    from draftscope.pipeline.config import DRAFTS, load_pipeline_config

    names: set[str] = set()
    for experiment in experiment_preset_names():
        for preset in model_preset_names():
            try:
                config = load_experiment(experiment, {"model_preset": preset})
                steps = plan_benchmark(config, "/runs/r").steps
            except UserError:
                continue  # a combination the kit refuses
            for found in steps:
                names |= {*found.env, *found.env_passthrough, *found.credentials}
    for preset in model_preset_names():
        for draft in DRAFTS:
            plan = planning.build(
                load_pipeline_config(draft=draft, preset=preset), registry.select("all"), Path("/w"), "docker"
            )
            fetch = planning.fetch_step(plan)
            for found in [fetch] if fetch is not None else []:
                names |= {*found.env, *found.credentials}
            for sp in plan.stages:
                names |= {*sp.step.env, *sp.step.env_passthrough, *sp.step.credentials}
                for command in sp.commands:
                    names |= set(command.env)
    return names


def test_every_variable_a_planned_step_or_server_gets_is_declared():
    declared = {v.name for v in S.variables()}
    missing = sorted(n for n in _planned_env_names() if n not in declared)
    assert missing == [], f"declare these in draftscope.core.settings: {missing}"


# --- reading: typed, and refused with one line when malformed ------------------------------------------------------

TYPED = [v for v in S.variables() if not v.is_family]
VALUES = (
    st.text(max_size=40)
    | st.from_regex(r"\s*-?[0-9]{1,25}\s*", fullmatch=True)
    | st.sampled_from(
        ["0", "1", "prefix", "DENSE", "after-records:3:exit:7", "a" * 40, "true", " ", "", "1_000", "+5", "٣"]
    )
)


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@given(value=VALUES)
@pytest.mark.parametrize("variable", TYPED, ids=[v.name for v in TYPED])
def test_any_value_reads_or_is_one_line_naming_the_variable_value_and_fix(variable, value):
    env = {variable.name: value}
    try:
        got = variable.get(env)
    except UserError as exc:
        assert variable.strict
        assert (
            exc.field == variable.name and exc.value == value and exc.fix.startswith(f"unset {variable.name}")
        )
        text = str(exc)
        assert "\n" not in text and variable.name in text and "fix:" in text
        return
    if not value.strip():
        assert got == variable.default
    assert got == variable.get({variable.name: value})  # reading twice reads the same


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@given(number=st.integers(min_value=-(10**12), max_value=10**12), pad=st.sampled_from(["", " ", "\t"]))
def test_a_positive_integer_reads_as_itself_and_no_other_number_reads(number, pad):
    env = {S.DRAFTSCOPE_PREFIX_K.name: f"{pad}{number}{pad}"}
    if number > 0:
        assert S.DRAFTSCOPE_PREFIX_K.get(env) == number
    else:
        with pytest.raises(UserError, match=r"DRAFTSCOPE_PREFIX_K: must be a positive integer .*fix: unset"):
            S.DRAFTSCOPE_PREFIX_K.get(env)


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@given(seconds=st.integers(min_value=0, max_value=2**40))
def test_unix_seconds_read_as_themselves(seconds):
    assert S.SOURCE_DATE_EPOCH.get({"SOURCE_DATE_EPOCH": str(seconds)}) == seconds


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@given(value=st.text(max_size=20).filter(lambda t: t.strip() and t.strip().lower() not in ("0", "1")))
def test_a_flag_is_0_or_1_and_nothing_else(value):
    with pytest.raises(UserError, match="DRAFTSCOPE_PREFIX_SHADOW: not 0 or 1"):
        S.DRAFTSCOPE_PREFIX_SHADOW.get({S.DRAFTSCOPE_PREFIX_SHADOW.name: value})


@pytest.mark.parametrize("blank", [None, "", "  ", "\t\n"])
def test_unset_and_blank_read_as_the_default(blank):
    env = {} if blank is None else {S.DRAFTSCOPE_PREFIX_K.name: blank}
    assert S.DRAFTSCOPE_PREFIX_K.get(env) == 64
    assert S.DRAFTSCOPE_PRESETS.get({} if blank is None else {S.DRAFTSCOPE_PRESETS.name: blank}) is None


def test_the_lenient_readers_ignore_a_malformed_value_as_they_always_did():
    assert S.DRAFTSCOPE_GIT_COMMIT.get({S.DRAFTSCOPE_GIT_COMMIT.name: "not-a-sha"}) is None
    assert S.DRAFTSCOPE_GIT_COMMIT.get({S.DRAFTSCOPE_GIT_COMMIT.name: "A" * 40}) is None
    assert S.DRAFTSCOPE_GIT_DIRTY.get({S.DRAFTSCOPE_GIT_DIRTY.name: "yes"}) is None
    assert S.TRITON_INTERPRET.get({"TRITON_INTERPRET": "On"}) is True
    assert S.TRITON_INTERPRET.get({"TRITON_INTERPRET": "0"}) is False


def test_the_prefix_switch_reads_its_aliases():
    read = S.DRAFTSCOPE_EXPERIMENTAL_PREFIX.get
    name = S.DRAFTSCOPE_EXPERIMENTAL_PREFIX.name
    assert [read({name: v}) for v in ("1", "Prefix ", "dense", "0", "")] == [
        "prefix",
        "prefix",
        "dense",
        None,
        None,
    ]
    with pytest.raises(UserError, match=r"unknown prefix-head mode.*use one of 0, 1, dense, prefix"):
        read({name: "yes"})


def test_reading_is_lazy_and_setting_reaches_the_process(monkeypatch):
    monkeypatch.setenv(S.DRAFTSCOPE_PREFIX_K.name, "5")
    assert S.DRAFTSCOPE_PREFIX_K.get() == 5
    monkeypatch.delenv(S.HF_HUB_OFFLINE.name, raising=False)
    S.HF_HUB_OFFLINE.set("1")
    assert S.HF_HUB_OFFLINE.raw() == "1"
    mine: dict[str, str] = {}
    S.TRITON_CACHE_DIR.set("/c", mine)
    assert mine == {"TRITON_CACHE_DIR": "/c"}


def test_a_family_lists_its_members():
    env = {"TRITON_A": "1", "TRITON_B": "", "TRITONX": "1", "PATH": "/bin"}
    assert S.TRITON_FAMILY.names(env) == ["TRITON_A", "TRITON_B"]


# --- child environments ---------------------------------------------------------------------------------------------


@hypothesis.settings(max_examples=100, deadline=None, derandomize=True)
@given(
    base=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), st.text(max_size=8), max_size=6),
    extra=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), st.text(max_size=8), max_size=4),
)
def test_a_child_inherits_everything_with_its_own_on_top(base, extra):
    before = dict(base)
    child = S.child_env(extra, environ=base)
    assert child == {**base, **extra} and base == before
    names = [*extra, "NOT_SET_ANYWHERE"]
    assert S.named(names, base) == {n: base[n] for n in names if n in base}
    assert S.present(names, base) == sorted({n for n in names if n in base})


def test_child_env_reads_this_process_by_default(monkeypatch):
    monkeypatch.setenv("DRAFTSCOPE_TEST_CHILD", "x")
    assert S.child_env({"B": "2"})["DRAFTSCOPE_TEST_CHILD"] == "x"


# --- the page -----------------------------------------------------------------------------------------------------


def test_the_committed_page_is_the_generated_one():
    page = ROOT / S.PAGE
    assert page.is_file() and page.read_text(encoding="utf-8") == entry.settings_page(), (
        "regenerate it: python -m draftscope settings --output docs/settings.md"
    )


def test_the_page_lists_every_variable_under_its_audience():
    text = entry.settings_page()
    for v in S.variables():
        assert f"| `{v.name}` |" in text
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        f"## {title}" for title, _ in S.AUDIENCES.values()
    ]


def test_the_command_prints_and_writes_the_page(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        assert entry.main(["settings"]) == 0
    assert out.getvalue() == entry.settings_page()
    assert entry.main(["settings", "--output", str(tmp_path / "settings.md")]) == 0
    assert (tmp_path / "settings.md").read_text(encoding="utf-8") == entry.settings_page()
    assert entry.main(["settings", "--output", str(tmp_path / "no" / "such" / "settings.md")]) == 2
