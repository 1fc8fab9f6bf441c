"""The host commands as a user runs them: fresh interpreters, real output, real exit codes."""

import json
import os
import subprocess
import sys
import time

import pytest

from support import HEAVY, ROOT, run_invoke

HOST_MODULES = [
    "draftscope",
    "draftscope.cli.tasks",
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
    assert elapsed < 2.0, f"invoke plan took {elapsed:.2f} s"
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


def test_join_variadic_accepts_several_runs():
    from draftscope.cli.tasks import join_variadic

    assert join_variadic(["analyze", "A", "B", "--report", "R", "C"]) == ["analyze", "A,B,C", "--report", "R"]
    assert join_variadic(["analyze", "A", "validate", "X"]) == ["analyze", "A", "validate", "X"]
    assert join_variadic(["plan", "--json"]) == ["plan", "--json"]


def test_analyze_two_runs_with_a_report_as_typed(tmp_path):
    runs = ROOT / "research" / "evidence" / "tiny-cpu-aa" / "runs"
    a, b = sorted(p for p in runs.iterdir() if p.is_dir())[:2]
    result = run_invoke("analyze", str(a), str(b), "--report", str(tmp_path / "REP"), env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert a.name in result.stdout and b.name in result.stdout
    assert (tmp_path / "REP" / "report.html").is_file() and len(list((tmp_path / "REP").glob("*.png"))) >= 3
