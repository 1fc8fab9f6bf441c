"""The host commands as a user runs them: fresh interpreters, real output, real exit codes."""

import json
import os
import subprocess
import sys
import time

import pytest

from support import HEAVY, ROOT, run_invoke, wall_bound

HOST_MODULES = [
    "draftscope",
    "draftscope.cli",
    "draftscope.cli.bench",
    "draftscope.bench.options",
    "draftscope.bench.plan",
    "draftscope.core.presets",
    "draftscope.ops.validate",
    "draftscope.core.rundir",
    "draftscope.cli.render",
    "draftscope.ops.doctor",
    "draftscope.core.schema",
    "draftscope.cli.analysis",
    "draftscope.analysis.compare",
    "draftscope.analysis.report",
    "draftscope.analysis.evidence",
    "draftscope.cli.pipeline",
    "draftscope.pipeline.plan",
    "draftscope.bench.supervisor",
    "draftscope.bench.backends.vllm",
    "draftscope.ops.images",
]


@pytest.fixture
def tripwire(tmp_path):
    """Fake heavy packages that leave a marker file if anything imports them."""
    fake = tmp_path / "fake"
    for name in HEAVY:
        pkg = fake / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"open({str(tmp_path / ('imported-' + name))!r}, 'w').close()\n")
    env = {"PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return tmp_path, env


def imported(tmp_path):
    return sorted(p.name.removeprefix("imported-") for p in tmp_path.glob("imported-*"))


def test_the_tripwire_works(tripwire):
    tmp, env = tripwire
    subprocess.run([sys.executable, "-c", "import torch"], env={**os.environ, **env}, check=True)
    assert imported(tmp) == ["torch"]


def test_host_modules_import_no_heavy_package(tripwire):
    tmp, env = tripwire
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in HOST_MODULES)
    code += f"assert not set({list(HEAVY)!r}) & set(sys.modules), sorted(sys.modules)\n"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True)
    assert imported(tmp) == []


def test_plan_prints_the_default_plan_fast_without_torch(tripwire):
    tmp, env = tripwire
    start = time.perf_counter()
    result = run_invoke("plan", env=env)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert imported(tmp) == []
    assert elapsed < wall_bound(2.0), f"invoke plan took {elapsed:.2f} s"
    out = result.stdout
    for needle in (
        "experiment transformers-baseline",
        "experiment vllm-int4-dflash2",
        "experimental prefix head",
        "Qwen/Qwen3.8-27B@1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0",
        "localhost/draftscope-vllm",
        "num_speculative_tokens 7",
        "12 prompts, sha256 ",
        "time limit 600 s",
        "download: ",
    ):
        assert needle in out, needle


def test_plan_json_and_overrides():
    result = run_invoke("plan", "--experiment", "tiny-cpu", "--json", "--opts", "repeats=2")
    assert result.returncode == 0, result.stderr
    (plan,) = json.loads(result.stdout)
    assert plan["experiment"]["repeats"] == 2 and plan["downloads"] == []
    assert plan["steps"][-1]["gpus"] == 0


def test_presets_lists_models_and_experiments():
    result = run_invoke("presets", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    for name in (
        "qwen38-27b",
        "qwen35-27b",
        "qwen35-122b",
        "qwen36-35b",
        "qwen38-flash-next",
        "qwen3-8b",
        "tiny",
        "transformers-baseline",
        "vllm-int4-dflash2",
        "vllm-int4-dflash2-prefix",
    ):
        assert name in result.stdout, name


def test_presets_show_resolves_defaults():
    result = run_invoke("presets", "--show", "vllm-int4-dflash2")
    assert result.returncode == 0, result.stderr
    assert "int4_dflash: true" in result.stdout and "seed: 0" in result.stdout  # seed comes from the defaults
    result = run_invoke("presets", "--show", "qwen38-27b")
    assert "target_layer_ids:" in result.stdout


def test_user_error_is_one_line_without_traceback():
    result = run_invoke("plan", "--experiment", "transformers-baseline", "--opts", "model=Org/Name")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    assert "revision" in lines[0] and "fix:" in lines[0]


def test_validate_cli_verdicts_and_exit_codes(tmp_path):
    from draftscope.core.rundir import RunDir

    config = {"schema_version": 1, "name": "t", "backend": "transformers", "model_preset": "tiny"}
    RunDir.create(tmp_path / "r", kind="benchmark", config=config, argv=["t"])
    ok = run_invoke("validate", str(tmp_path / "r"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0] == "ok   manifest.json (run-manifest)"
    manifest = tmp_path / "r" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"status": "created"', '"status": "done"'))
    bad = run_invoke("validate", str(tmp_path / "r"))
    assert bad.returncode == 1
    assert "FAIL manifest.json (run-manifest): $.status: 'done' is not allowed" in bad.stdout
    assert "1 of 1 file(s) failed" in bad.stderr


def test_validate_missing_directory_is_a_user_error(tmp_path):
    result = run_invoke("validate", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such run directory" in result.stderr


def test_in_container_entry_point_selfcheck():
    result = subprocess.run(
        [sys.executable, "-m", "draftscope", "selfcheck"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["schemas"] >= 8
    assert report["versions"]["draftscope"]


@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        (
            "  block_size: 8\n",
            "  block_size: 8\n  blok_size: 8\n",
            ["$.dflash.blok_size", "unknown key 'blok_size'"],
        ),
        (
            "b968826d9c46dd6066d109eabc6255188de91218",
            "b968826",
            ["$.hub.revision", "'b968826'", "40-character"],
        ),
    ],
    ids=["unknown-key", "short-revision"],
)
def test_a_bad_preset_is_one_line_naming_file_key_and_fix(tmp_path, old, new, needles):
    import shutil

    shutil.copytree(ROOT / "presets", tmp_path / "presets")
    path = tmp_path / "presets" / "models" / "qwen3-8b.yaml"
    path.write_text(path.read_text().replace(old, new, 1))
    result = run_invoke("presets", env={"DRAFTSCOPE_PRESETS": str(tmp_path / "presets")})
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert str(path) in line and "fix:" in line
    for needle in needles:
        assert needle in line


# --- several runs: one positional, then `--run` (invoke) or more words (draftscope) ----------------------------


def run_draftscope(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """`draftscope ARGS` as the console script runs it (`draftscope.cli:main`), in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from draftscope.cli import main; sys.exit(main())", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_draftscope_moves_extra_positionals_into_the_repeatable_option():
    from draftscope.cli import ns
    from draftscope.cli.program import rewrite

    assert rewrite(["analyze", "A", "B", "--report", "R", "C"], ns) == (
        ["analyze", "A", "--run", "B", "--report", "R", "--run", "C"],
        None,
    )
    assert rewrite(["analyze", "A", "--report", "R", "B"], ns) == (
        ["analyze", "A", "--report", "R", "--run", "B"],
        None,
    )
    assert rewrite(["analyze", "A", "--report=R", "B"], ns) == (
        ["analyze", "A", "--report=R", "--run", "B"],
        None,
    )
    # A task name after the positionals starts the next task; other tasks take no extra words.
    assert rewrite(["analyze", "A", "validate", "X"], ns) == (["analyze", "A", "validate", "X"], None)
    assert rewrite(["compare", "A", "B", "--seed", "3"], ns) == (["compare", "A", "B", "--seed", "3"], None)
    assert rewrite(["share", "A", "B"], ns) == (["share", "A", "B"], None)
    assert rewrite(["plan", "--json"], ns) == (["plan", "--json"], None)


def test_draftscope_turns_task_help_into_invokes_help_for_that_task():
    from draftscope.cli import ns
    from draftscope.cli.program import rewrite

    assert rewrite(["validate", "--help"], ns) == (["validate"], "validate")
    assert rewrite(["compare", "-h"], ns) == (["compare"], "compare")
    assert rewrite(["images.build", "vllm", "-h"], ns) == (["images.build", "vllm"], "images.build")
    # An option's value is a value, even one that reads like a flag.
    assert rewrite(["analyze", "A", "--report", "-h"], ns) == (["analyze", "A", "--report", "-h"], None)


def test_draftscope_rewrites_only_the_task_words():
    from draftscope.cli import ns
    from draftscope.cli.program import DraftscopeProgram

    def parsed(*words: str) -> list[str]:
        program = DraftscopeProgram(namespace=ns, name="draftscope", binary="draftscope")
        program.normalize_argv(["draftscope", *words])
        return program.argv[1:]

    assert parsed("--echo", "-f", "my.yaml", "analyze", "A", "B") == [
        "--echo",
        "-f",
        "my.yaml",
        "analyze",
        "A",
        "--run",
        "B",
    ]
    assert parsed("-e", "validate", "--help") == ["-e", "--help", "validate"]
    assert parsed("analyze", "A", "B", "--", "x", "y") == ["analyze", "A", "--run", "B", "--", "x", "y"]


def test_no_option_takes_the_help_flags_short_name():
    from draftscope.cli import ns

    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            assert "h" not in arg.names, f"{name}: --{arg.name} takes -h, invoke's help flag"


def test_analyze_several_runs_with_a_report_as_typed(tmp_path):
    runs = ROOT / "research" / "evidence" / "tiny-cpu-aa" / "runs"
    a, b = sorted(p for p in runs.iterdir() if p.is_dir())[:2]
    env = {"COLUMNS": "200"}
    typed = run_invoke("analyze", str(a), "--run", str(b), "--report", str(tmp_path / "REP"), env=env)
    assert typed.returncode == 0, typed.stderr
    assert a.name in typed.stdout and b.name in typed.stdout
    assert (tmp_path / "REP" / "report.html").is_file() and len(list((tmp_path / "REP").glob("*.png"))) >= 3
    words = run_draftscope("analyze", str(a), str(b), env=env)
    assert words.returncode == 0, words.stderr
    assert a.name in words.stdout and b.name in words.stdout
    # invoke itself reads a second bare word as a task name, and says so.
    bare = run_invoke("analyze", str(a), str(b))
    assert bare.returncode == 1 and f"No idea what '{b}' is!" in bare.stderr


def test_draftscope_version_names_the_kit():
    from draftscope import __version__

    result = run_draftscope("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"draftscope {__version__}")


def test_no_package_makes_every_process_build_a_grammar_when_jsonschema_is_imported():
    """jsonschema imports rfc3987-syntax when it is installed (its format-nongpl extra), and that package builds a
    Lark grammar at import: about a second more for every `invoke` process, which made the bad-input corpus (200
    processes) outrun its time limit. The kit checks its only format (date-time) itself; nothing it installs may
    bring the package back (cyclonedx-python-lib's json-validation extra did)."""
    import importlib.util

    assert importlib.util.find_spec("rfc3987_syntax") is None, (
        "rfc3987-syntax is installed: find what requires jsonschema[format-nongpl] (pip show -v) and drop that extra"
    )
