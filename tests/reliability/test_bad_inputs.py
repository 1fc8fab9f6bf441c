"""The bad-input corpus: one parametrized case per bad input, each run through the real command line (`invoke …`).

Every case must be refused with exactly one line on stderr, starting `error:` and naming what is wrong (the
expected phrase), no traceback, a non-zero exit, and no state left behind: the case's folder (its input files,
any pre-existing output) is byte-identical afterwards and no run directory or workdir appears. Values carrying
shell metacharacters must reach no shell: the canary file they try to create never appears.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import ROOT, run_invoke, unavailable

pytestmark = pytest.mark.reliability

SHA = "0123456789abcdef0123456789abcdef01234567"
PROMPT = '{"id": "p1", "messages": [{"role": "user", "content": "hi"}]}'


def prompts(*items: str, head: str = '"schema_version": 1, "name": "bad"') -> str:
    return "{" + head + ', "prompts": [' + ", ".join(items) + "]}"


def bench(*extra: str, **flags: str | None) -> tuple[str, ...]:
    """`invoke benchmark` on the tiny CPU path into {run}; a flag set to None is left out."""
    base = {
        "backend": "transformers",
        "preset": "tiny",
        "device": "cpu",
        "runtime": "local",
        "prompts": "examples/prompts.json",
        "repeats": "1",
        "max-new-tokens": "4",
        "output": "{run}",
    }
    base.update({k.replace("_", "-"): v for k, v in flags.items()})
    argv = ["benchmark"]
    for name, value in base.items():
        if value is not None:
            argv += [f"--{name}", value]
    return (*argv, *extra)


def pipe(*extra: str, preset: str = "tiny", stage: str = "regen") -> tuple[str, ...]:
    """`invoke pipeline` on the tiny CPU path with the workdir {tmp}/w."""
    head = ("pipeline", "--preset", preset, "--runtime", "local", "--stage", stage, "--workdir", "{tmp}/w")
    return (*head, *extra)


def copy_presets(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    """A private presets folder ($DRAFTSCOPE_PRESETS) with one file edited."""

    def setup(tmp: Path) -> None:
        shutil.copytree(ROOT / "presets", tmp / "presets")
        edit(tmp / "presets")

    return setup


def edit_qwen(old: str, new: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "models" / "qwen3-8b.yaml"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))

    return edit


def fake_tool(name: str) -> Callable[[Path], None]:
    """Evidence of a non-NVIDIA accelerator stack on PATH (the real one cannot exist on this machine)."""

    def setup(tmp: Path) -> None:
        (tmp / "bin").mkdir()
        tool = tmp / "bin" / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)

    return setup


def huge_file(tmp: Path) -> None:
    with (tmp / "huge.json").open("wb") as fh:  # sparse: the size is checked before anything is read
        fh.truncate(65 * 2**20)


def fifo(name: str) -> Callable[[Path], None]:
    """A named pipe where a file is expected: nobody ever writes to it, so a reader that opens it blocks."""

    def setup(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return setup


# A billion-laughs document: ten levels of ten aliases each (10**10 items once expanded).
ALIAS_BOMB = "laughs:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
)


def existing_run(tmp: Path) -> None:
    (tmp / "run").mkdir()
    (tmp / "run" / "notes.txt").write_text("someone's earlier work\n")


def storage_conf(tmp: Path) -> None:
    """An empty image store for podman: a real engine that has no kit image."""
    (tmp / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{tmp}/graph"\nrunroot = "{tmp}/runroot"\n'
    )


def pipe_at(workdir: str) -> tuple[str, ...]:
    """`invoke pipeline` on the tiny CPU path with the given workdir."""
    return ("pipeline", "--preset", "tiny", "--runtime", "local", "--stage", "regen", "--workdir", workdir)


def link_loop(tmp: Path) -> None:
    (tmp / "loop").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop")


def dangling(tmp: Path) -> None:
    (tmp / "dangling").symlink_to(tmp / "nowhere")


def _can_mount_read_only() -> bool:
    """Root (as in CI containers) may write in a mode-0555 folder, so a read-only folder there has to be a read-only
    mount: possible where this process may mount (CAP_SYS_ADMIN), impossible otherwise."""
    if os.geteuid() != 0:
        return True  # chmod is enough
    if not shutil.which("mount"):
        return False
    probe = Path(tempfile.mkdtemp())
    try:
        ok = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro", "none", str(probe)], capture_output=True
        ).returncode
        if ok == 0:
            subprocess.run(["umount", str(probe)], capture_output=True)
        return ok == 0
    finally:
        probe.rmdir()


# Without it the read-only cases are left out (root without the right to mount cannot make a read-only folder).
READ_ONLY_POSSIBLE = _can_mount_read_only()


def read_only_dir(tmp: Path) -> None:
    folder = tmp / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        atexit.register(folder.chmod, 0o755)  # so that pytest can remove its temporary folders
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "none", str(folder)], check=True)
    atexit.register(subprocess.run, ["umount", str(folder)], capture_output=True)


@dataclass(frozen=True)
class Bad:
    id: str
    args: tuple[str, ...]
    expect: str  # a phrase the one-line error must hold (the field, the value or the rule)
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    needs: str | None = None  # an executable the case needs on PATH


CASES = [
    # --- prompt files ---------------------------------------------------------------------------------------------
    Bad(
        "prompts-malformed-json", bench(prompts="{tmp}/p.json"), "not valid JSON", {"p.json": '{"prompts": ['}
    ),
    Bad("prompts-empty-file", bench(prompts="{tmp}/p.json"), "not valid JSON", {"p.json": ""}),
    Bad("prompts-non-utf8", bench(prompts="{tmp}/p.json"), "not UTF-8", {"p.json": b'{"name": "\xff\xfe"}'}),
    Bad("prompts-huge-file", bench(prompts="{tmp}/huge.json"), "the limit is 64 MiB", setup=huge_file),
    Bad(
        "prompts-duplicate-ids",
        bench(prompts="{tmp}/p.json"),
        "duplicate prompt ids",
        {"p.json": prompts(PROMPT, PROMPT)},
    ),
    Bad(
        "prompts-id-wrong-type",
        bench(prompts="{tmp}/p.json"),
        "$.prompts[0].id",
        {"p.json": prompts('{"id": 7, "messages": [{"role": "user", "content": "hi"}]}')},
    ),
    Bad(
        "prompts-messages-not-a-list",
        bench(prompts="{tmp}/p.json"),
        "$.prompts[0].messages",
        {"p.json": prompts('{"id": "a", "messages": "hi"}')},
    ),
    Bad(
        "prompts-unknown-key",
        bench(prompts="{tmp}/p.json"),
        "unknown key 'temperature'",
        {
            "p.json": prompts(
                '{"id": "a", "temperature": 0.7, "messages": [{"role": "user", "content": "hi"}]}'
            )
        },
    ),
    Bad("prompts-empty-list", bench(prompts="{tmp}/p.json"), "$.prompts", {"p.json": prompts()}),
    Bad(
        "prompts-empty-content",
        bench(prompts="{tmp}/p.json"),
        "content",
        {"p.json": prompts('{"id": "a", "messages": [{"role": "user", "content": ""}]}')},
    ),
    Bad(
        "prompts-unknown-role",
        bench(prompts="{tmp}/p.json"),
        "'tool' is not allowed",
        {"p.json": prompts('{"id": "a", "messages": [{"role": "tool", "content": "x"}]}')},
    ),
    Bad(
        "prompts-top-level-list",
        bench(prompts="{tmp}/p.json"),
        "expected a JSON object at the top level",
        {"p.json": "[1, 2]"},
    ),
    Bad("prompts-missing-file", bench(prompts="{tmp}/nowhere.json"), "prompt file not found"),
    Bad("prompts-a-folder", bench(prompts="{tmp}"), "is a directory, not a regular file"),
    # --- numbers ----------------------------------------------------------------------------------------------------
    Bad("repeats-negative", bench(repeats="-1"), "--repeats: must be at least 1"),
    Bad("repeats-zero", bench(repeats="0"), "--repeats: must be at least 1"),
    Bad("repeats-not-an-integer", bench(repeats="1.5"), "--repeats: expected an integer"),
    Bad("repeats-absurd", bench(repeats="1000000"), "--repeats: must be at most 1,000"),
    Bad("max-seconds-negative", bench("--max-seconds", "-5"), "--max-seconds: must be more than 0"),
    Bad("max-seconds-nan", bench("--max-seconds", "nan"), "--max-seconds: expected a finite number"),
    Bad("max-seconds-infinite", bench("--max-seconds", "inf"), "--max-seconds: expected a finite number"),
    Bad("max-new-tokens-absurd", bench(max_new_tokens="100000000000"), "--max-new-tokens: must be at most"),
    Bad(
        "memory-fraction-above-one", bench("--memory-fraction", "1.5"), "--memory-fraction: must be at most 1"
    ),
    Bad("warmups-negative", bench("--warmups", "-1"), "--warmups: must be at least 0"),
    Bad("fixed-tokens-zero", bench("--fixed-tokens", "0"), "--fixed-tokens: must be at least 1"),
    Bad("draft-tokens-absurd", bench("--draft-tokens", "1000"), "--draft-tokens: must be at most 64"),
    Bad("opts-nan", bench("--opts", "max_seconds=.nan"), "not a finite number"),
    Bad("opts-seed-negative", bench("--opts", "seed=-1"), "--opts seed:"),
    Bad("opts-wrong-type", bench("--opts", "repeats=many"), "is not of type 'integer'"),
    Bad("opts-value-for-a-section", bench("--opts", "vllm=3"), "--opts vllm:"),
    # --- unknown and misspelled keys, malformed overrides and config files -------------------------------------
    Bad("opts-misspelled-key", bench("--opts", "repeat=3"), "did you mean 'repeats'"),
    Bad(
        "opts-misspelled-nested-key",
        bench("--opts", "vllm.max_model_lenght=4096"),
        "did you mean 'max_model_len'",
    ),
    Bad("opts-without-equals", bench("--opts", "repeats"), "key=value"),
    Bad("opts-empty-key-part", bench("--opts", "vllm..x=1"), "empty component"),
    Bad(
        "experiment-file-misspelled-key",
        bench("--experiment", "{tmp}/e.yaml"),
        "did you mean 'max_new_tokens'",
        {
            "e.yaml": "schema_version: 1\nname: mine\nbackend: transformers\nmodel_preset: tiny\nmax_new_token: 8\n"
        },
    ),
    Bad(
        "experiment-file-not-a-mapping",
        bench("--experiment", "{tmp}/e.yaml"),
        "expected a mapping",
        {"e.yaml": "- 1\n- 2\n"},
    ),
    Bad(
        "experiment-file-invalid-yaml",
        bench("--experiment", "{tmp}/e.yaml"),
        "not valid YAML",
        {"e.yaml": "name: [unclosed\n"},
    ),
    Bad(
        "experiment-file-non-utf8",
        bench("--experiment", "{tmp}/e.yaml"),
        "not UTF-8",
        {"e.yaml": b"name: \xff\n"},
    ),
    # --- revisions and remote code ------------------------------------------------------------------------------
    Bad("model-without-revision", bench("--model", "Org/Name"), "revision"),
    Bad("model-short-revision", bench("--model", "Org/Name", "--revision", "abc1234"), "--revision:"),
    Bad("model-non-hex-revision", bench("--model", "Org/Name", "--revision", "g" * 40), "--revision:"),
    Bad("draft-without-revision", bench("--draft", "Org/Draft"), "draft_revision"),
    Bad("revision-without-model", bench("--revision", SHA), "without --model"),
    Bad(
        "tiny-draft-with-a-hub-target",
        bench("--draft", "tiny", preset="qwen3-8b"),
        "pairs only with the tiny target",
    ),
    Bad(
        "preset-short-revision",
        bench(preset="qwen3-8b"),
        "$.hub.revision",
        env={"DRAFTSCOPE_PRESETS": "{tmp}/presets"},
        setup=copy_presets(edit_qwen("b968826d9c46dd6066d109eabc6255188de91218", "b968826")),
    ),
    Bad(
        "preset-trust-remote-code",
        bench(preset="qwen3-8b"),
        "unknown key 'trust_remote_code'",
        env={"DRAFTSCOPE_PRESETS": "{tmp}/presets"},
        setup=copy_presets(
            edit_qwen("  repo: Qwen/Qwen3-8B\n", "  repo: Qwen/Qwen3-8B\n  trust_remote_code: true\n")
        ),
    ),
    Bad(
        "opts-trust-remote-code", bench("--opts", "trust_remote_code=true"), "unknown key 'trust_remote_code'"
    ),
    Bad(
        "opts-vllm-trust-remote-code",
        bench("--opts", "vllm.trust_remote_code=true"),
        "unknown key 'trust_remote_code'",
    ),
    # --- shell metacharacters: data, never a shell ----------------------------------------------------------------
    Bad("opts-name-with-semicolon", bench("--opts", "name=x;touch {canary}"), "--opts name:"),
    Bad(
        "opts-model-with-backticks",
        bench("--opts", "model=`touch {canary}`/x", "--opts", f"revision={SHA}"),
        "--opts model:",
    ),
    Bad("opts-prompts-with-subshell", bench("--opts", "prompts=$(touch {canary})"), "prompt file not found"),
    Bad("opts-runtime-with-pipe", bench("--opts", "runtime=local|touch {canary}"), "--opts runtime:"),
    # --- output paths -----------------------------------------------------------------------------------------------
    Bad("output-name-with-a-space", bench(output="{tmp}/my run"), "becomes the run id"),
    Bad("output-hidden-name", bench(output="{tmp}/.run"), "becomes the run id"),
    Bad("output-exists", bench(), "already exists", setup=existing_run),
    Bad("output-is-a-file", bench(), "already exists", {"run": "not a folder\n"}),
    Bad("output-missing", bench(output=None), "no run directory given"),
    # --- the pipeline's configs and paths --------------------------------------------------------------------------
    Bad(
        "pipeline-checkpoint-escapes-workdir",
        pipe("--opts", "convert.checkpoint=../../../etc"),
        "--opts convert.checkpoint:",
    ),
    Bad("pipeline-name-escapes-runs", pipe("--opts", "name=../../x"), "--opts name:"),
    Bad("pipeline-misspelled-key", pipe("--opts", "regen.concurency=3"), "did you mean 'concurrency'"),
    Bad("pipeline-negative-epochs", pipe("--opts", "train.epochs=-1"), "--opts train.epochs:"),
    Bad("pipeline-zero-concurrency", pipe("--opts", "regen.concurrency=0"), "--opts regen.concurrency:"),
    Bad("pipeline-unknown-stage", pipe(stage="regen,convrt"), "unknown stage 'convrt'"),
    Bad("pipeline-unknown-draft", pipe("--draft", "dflash3"), "--draft: unknown draft 'dflash3'"),
    Bad(
        "pipeline-config-trust-remote-code",
        pipe("--config", "{tmp}/run.yaml"),
        "unknown key 'trust_remote_code'",
        {"run.yaml": "trust_remote_code: true\n"},
    ),
    Bad(
        "pipeline-missing-chat-rows", pipe("--opts", "data.chat={tmp}/nowhere.jsonl"), "input file not found"
    ),
    Bad("pipeline-gpus-on-a-cpu-run", pipe("--opts", "regen.instances=[{gpus: [0]}]"), "no GPUs to assign"),
    Bad(
        "pipeline-hub-preset-on-a-cpu", pipe("--opts", "device=cpu", preset="qwen3-8b"), "cannot run on a CPU"
    ),
    # --- GPUs, engines, images ------------------------------------------------------------------------------------
    Bad("gpu-missing", bench(device="cuda"), "no NVIDIA GPU found"),
    Bad(
        "gpu-not-nvidia",
        bench(device="cuda"),
        "AMD ROCm",
        env={"PATH": "{tmp}/bin:" + os.environ.get("PATH", "")},
        setup=fake_tool("rocm-smi"),
    ),
    # vLLM's CPU engine serves the tiny models only, and only when asked for by --device cpu (never a fallback)
    Bad("vllm-tiny-on-cuda", bench(backend="vllm", device="cuda"), "served by vLLM's CPU engine only"),
    Bad(
        "vllm-cpu-hub-preset", bench(backend="vllm", preset="qwen3-8b"), "runs the kit-built tiny models only"
    ),
    Bad("engine-missing", bench(runtime="docker"), "is not installed", env={"PATH": "{tmp}/empty"}),
    Bad(
        "engine-not-answering",
        bench(runtime="docker"),
        "does not answer",
        env={"DOCKER_HOST": "unix://{tmp}/no.sock"},
        needs="docker",
    ),
    Bad(
        "image-missing",
        bench(runtime="podman"),
        "is not present for podman",
        env={"CONTAINERS_STORAGE_CONF": "{tmp}/storage.conf"},
        setup=storage_conf,
        needs="podman",
    ),
    Bad("unknown-runtime", bench(runtime="kubernetes"), "--runtime: unknown runtime 'kubernetes'"),
    Bad("unknown-backend", bench(backend="tgi"), "unknown backend"),
    Bad("unknown-device", bench(device="tpu"), "--device: unknown device 'tpu'"),
    Bad("misspelled-preset", bench(preset="tinyy"), "did you mean 'tiny'"),
    Bad("unknown-experiment", bench("--experiment", "nosuch"), "no experiment preset named 'nosuch'"),
    # --- output paths (h18-signals) -------------------------------------------------------------------------------
    Bad("output-parent-is-a-file", bench(output="{tmp}/f/run"), "/f is a file, not a folder", {"f": "x"}),
    Bad("output-under-a-file", bench(output="{tmp}/f/a/run"), "/f is a file, not a folder", {"f": "x"}),
    Bad("output-under-proc", bench(output="/proc/draftscope-run"), "kernel file system"),
    Bad("output-under-sys", bench(output="/sys/draftscope-run"), "kernel file system"),
    Bad("output-symlink-loop", bench(output="{tmp}/loop/run"), "symbolic link loop", setup=link_loop),
    Bad("output-is-symlink-loop", bench(output="{tmp}/loop"), "symbolic link loop", setup=link_loop),
    Bad(
        "output-broken-link-parent",
        bench(output="{tmp}/dangling/run"),
        "broken symbolic link",
        setup=dangling,
    ),
    Bad("workdir-parent-is-a-file", pipe_at("{tmp}/f/w"), "/f is a file, not a folder", {"f": "x"}),
    Bad("workdir-is-a-file", pipe_at("{tmp}/f"), "exists and is not a folder", {"f": "x"}),
    Bad("workdir-under-proc", pipe_at("/proc/draftscope-w"), "kernel file system"),
    Bad("workdir-symlink-loop", pipe_at("{tmp}/loop/w"), "symbolic link loop", setup=link_loop),
    *(
        [
            Bad(
                "output-read-only-parent",
                bench(output="{tmp}/ro/run"),
                "is not writable",
                setup=read_only_dir,
            ),
            Bad("workdir-read-only-parent", pipe_at("{tmp}/ro/w"), "is not writable", setup=read_only_dir),
        ]
        if READ_ONLY_POSSIBLE
        else []
    ),
    # --- untrusted run directories (h18-trust) ---------------------------------------------------------------------
    # A run directory is data: a lock or manifest naming a program, a run id naming a path, a file that is a pipe or
    # a link out of the run is refused before anything runs or is written (tests/integration/test_hostile_rundir.py
    # covers each command more widely).
    Bad(
        "recover-lock-names-a-program",
        ("recover", "{tmp}/run"),
        "step.engine: names a program that is not a container engine",
        setup=lambda tmp: planted_run(
            tmp, killed=True, lock={"step": {"name": "b", "engine": str(tmp / "canary")}}
        ),
    ),
    Bad(
        "recover-lock-pgid-not-a-number",
        ("recover", "{tmp}/run"),
        "step.pgid: must be a process number",
        setup=lambda tmp: planted_run(tmp, killed=True, lock={"step": {"name": "b", "pgid": "-1"}}),
    ),
    Bad(
        "recover-manifest-without-status",
        ("recover", "{tmp}/run"),
        "'status' is required",
        setup=lambda tmp: planted_run(tmp, killed=True, manifest=lambda d: d.pop("status")),
    ),
    Bad(
        "share-run-id-escapes",
        ("share", "{tmp}/run", "--output", "{tmp}/b.tar.gz"),
        "$.run_id: is not a run id",
        setup=lambda tmp: planted_run(tmp, manifest=lambda d: d.update(run_id="../../escape")),
    ),
    Bad(
        "share-manifest-links-out",
        ("share", "{tmp}/run", "--output", "{tmp}/b.tar.gz"),
        "manifest.json is a link pointing out of the run directory",
        setup=lambda tmp: planted_run(tmp, link_out="manifest.json"),
    ),
    Bad(
        "analyze-records-a-named-pipe",
        ("analyze", "{tmp}/run"),
        "records.jsonl is a named pipe",
        setup=lambda tmp: planted_run(tmp, fifo="records.jsonl"),
    ),
    Bad(
        "compare-an-unfinished-run",
        ("compare", "{tmp}/run", "{tmp}/run2", "--output", "{tmp}/c.json"),
        "run run2 is unfinished (status 'interrupted'",
        setup=lambda tmp: (
            planted_run(tmp),
            _interrupted_run(tmp / "run2"),
        ),
    ),
    Bad(
        "compare-resamples-absurd",
        ("compare", "{tmp}/run", "{tmp}/run2", "--resamples", "1000000000", "--output", "{tmp}/c.json"),
        "--resamples: must be at most 1,000,000",
        setup=lambda tmp: (planted_run(tmp), planted_run(tmp, "run2")),
    ),
    Bad(
        "reproduce-prompt-copy-links-out",
        ("reproduce", "{tmp}/run", "--output", "{tmp}/new"),
        "inputs/prompts.json is a link pointing out of the run directory",
        setup=lambda tmp: planted_run(tmp, link_out="inputs/prompts.json"),
    ),
    # --- reading boundary (h18-read) ---
    Bad(
        "read-prompts-deep-nesting",
        bench(prompts="{tmp}/p.json"),
        "nested deeper than 64 levels",
        {"p.json": prompts(PROMPT, "[" * 100_000 + "]" * 100_000)},
    ),
    Bad(
        "read-prompts-huge-int",
        bench(prompts="{tmp}/p.json"),
        "a number literal of 5000 digits",
        {"p.json": prompts(PROMPT, head='"schema_version": ' + "1" * 5000 + ', "name": "bad"')},
    ),
    Bad(
        "read-prompts-duplicate-key",
        bench(prompts="{tmp}/p.json"),
        "the key 'name' appears twice",
        {"p.json": prompts(PROMPT, head='"schema_version": 1, "name": "a", "name": "b"')},
    ),
    Bad(
        "read-prompts-nan",
        bench(prompts="{tmp}/p.json"),
        "NaN is not JSON",
        {"p.json": prompts(PROMPT, head='"schema_version": NaN, "name": "bad"')},
    ),
    Bad(
        "read-prompts-not-an-object",
        bench(prompts="{tmp}/p.json"),
        "expected a JSON object",
        {"p.json": "[]"},
    ),
    Bad("read-prompts-fifo", bench(prompts="{tmp}/fifo.json"), "named pipe", setup=fifo("fifo.json")),
    Bad("read-prompts-directory", bench(prompts="{tmp}/empty"), "is a directory"),
    Bad(
        "read-experiment-alias-bomb",
        bench("--experiment", "{tmp}/e.yaml"),
        "YAML anchors and aliases are not accepted",
        {"e.yaml": "schema_version: 1\nname: mine\nbackend: transformers\nmodel_preset: tiny\n" + ALIAS_BOMB},
    ),
    Bad(
        "read-experiment-duplicate-key",
        bench("--experiment", "{tmp}/e.yaml"),
        "the key 'name' appears twice",
        {"e.yaml": "schema_version: 1\nname: mine\nbackend: transformers\nmodel_preset: tiny\nname: other\n"},
    ),
    Bad(
        "read-pipeline-config-self-alias",
        pipe("--config", "{tmp}/run.yaml"),
        "YAML anchors and aliases are not accepted",
        {"run.yaml": "stages: &s [*s]\n"},
    ),
    Bad(
        "read-preset-override-anchor",
        bench(preset="qwen3-8b"),
        "YAML anchors and aliases are not accepted",
        env={"DRAFTSCOPE_PRESETS": "{tmp}/presets"},
        setup=copy_presets(edit_qwen("  revision: b968826d", "  revision: &pin b968826d")),
    ),
    Bad("read-opts-alias", bench("--opts", "vllm=&a [*a]"), "YAML anchors and aliases are not accepted"),
    Bad("read-revision-newline", bench("--model", "Org/Name", "--revision", SHA + "\n"), "--revision:"),
]


def _interrupted_run(path: Path) -> None:
    """A run that ended early as a killed one does: status `interrupted`, its summary partial (the last prompt
    missing), so it follows from its records and the refusal under test is the unfinished one."""
    from test_analysis_synthetic import make_run

    make_run(path, repeats=1, status="interrupted")


def planted_run(
    tmp: Path,
    name: str = "run",
    *,
    killed: bool = False,
    lock: dict | None = None,
    manifest: Callable[[dict], None] | None = None,
    link_out: str | None = None,
    fifo: str | None = None,
) -> None:
    """A small synthetic run (the kit's RunDir; no model runs) at {tmp}/NAME, with one hostile thing planted:
    `killed` leaves it `running` with the lock of a dead supervisor (facts updated by `lock`)."""
    import json

    from test_analysis_synthetic import make_run

    run = make_run(tmp / name, repeats=1)
    doc = json.loads((run / "manifest.json").read_text())
    if killed:
        doc.update(status="running", reason=None, finished_at=None)
        (run / "summary.json").unlink()
        facts = {"pid": 4_000_000, "host": socket.gethostname(), **(lock or {})}
        (run / ".supervisor").write_text(json.dumps(facts))
    if manifest is not None:
        manifest(doc)
    (run / "manifest.json").write_text(json.dumps(doc))
    if link_out is not None:
        outside = tmp / f"outside-{Path(link_out).name}"
        outside.write_bytes((run / link_out).read_bytes())
        (run / link_out).unlink()
        (run / link_out).symlink_to(outside)
    if fifo is not None:
        (run / fifo).unlink()
        os.mkfifo(run / fifo)


# --- every command (named) -----------------------------------------------------------------------------------------
# At least a few named refusals for each command beside benchmark and pipeline: the shapes of bad input a user meets
# there (a missing or wrong kind of path, a number out of range, an unknown name, a run directory that is not one).
def _research_copy(tmp: Path) -> None:
    shutil.copytree(ROOT / "research", tmp / "research")


def _tampered_research(tmp: Path) -> None:
    _research_copy(tmp)
    claims = tmp / "research" / "claims.yaml"
    claims.write_text(claims.read_text() + "\n# edited\n")


def _manifest_as(text: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        planted_run(tmp)
        (tmp / "run" / "manifest.json").write_text(text)

    return setup


def _manifest_loop(tmp: Path) -> None:
    planted_run(tmp)
    (tmp / "run" / "manifest.json").unlink()
    (tmp / "run" / "manifest.json").symlink_to(tmp / "run" / "manifest.json")


def _inputs_deleted(tmp: Path) -> None:
    planted_run(tmp)
    (tmp / "run" / "inputs" / "prompts.json").unlink()


def _records_deleted(tmp: Path) -> None:
    planted_run(tmp)
    (tmp / "run" / "records.jsonl").unlink()


def _fifo(name: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return setup


def _full_folder(tmp: Path) -> None:
    (tmp / "full").mkdir()
    (tmp / "full" / "x").write_text("someone's work\n")


def _two_runs(tmp: Path) -> None:
    planted_run(tmp)
    planted_run(tmp, "run2")


def _killed_run(tmp: Path) -> None:
    planted_run(tmp, killed=True)


EVERY_COMMAND = [
    # validate
    Bad("validate-missing-run", ("validate", "{tmp}/nowhere"), "no such run directory"),
    Bad("validate-a-file", ("validate", "{tmp}/f"), "no such run directory", {"f": "x"}),
    Bad("validate-empty-folder", ("validate", "{tmp}/empty"), "failed validation"),
    Bad("validate-manifest-a-list", ("validate", "{tmp}/run"), "failed validation", setup=_manifest_as("[]")),
    Bad(
        "validate-manifest-malformed", ("validate", "{tmp}/run"), "failed validation", setup=_manifest_as("{")
    ),
    Bad("validate-manifest-link-loop", ("validate", "{tmp}/run"), "failed validation", setup=_manifest_loop),
    Bad(
        "validate-records-fifo",
        ("validate", "{tmp}/run"),
        "failed validation",
        setup=lambda t: planted_run(t, fifo="records.jsonl"),
    ),
    Bad("validate-inputs-deleted", ("validate", "{tmp}/run"), "failed validation", setup=_inputs_deleted),
    Bad("validate-records-deleted", ("validate", "{tmp}/run"), "failed validation", setup=_records_deleted),
    Bad(
        "validate-manifest-links-out",
        ("validate", "{tmp}/run"),
        "failed validation",
        setup=lambda t: planted_run(t, link_out="manifest.json"),
    ),
    # plan
    Bad("plan-unknown-experiment", ("plan", "--experiment", "nosuch"), "no experiment preset named 'nosuch'"),
    Bad("plan-prompts-missing", ("plan", "--prompts", "{tmp}/nowhere.json"), "not found"),
    Bad("plan-prompts-malformed", ("plan", "--prompts", "{tmp}/p.json"), "not valid JSON", {"p.json": "{"}),
    Bad("plan-prompts-fifo", ("plan", "--prompts", "{tmp}/fifo"), "named pipe", setup=_fifo("fifo")),
    Bad("plan-prompts-directory", ("plan", "--prompts", "{tmp}/empty"), "empty"),
    Bad("plan-opts-misspelled", ("plan", "--opts", "repets=2"), "repeats"),
    Bad("plan-opts-without-equals", ("plan", "--opts", "repeats"), "key=value"),
    Bad("plan-opts-negative-repeats", ("plan", "--opts", "repeats=-1"), "repeats"),
    # presets
    Bad("presets-unknown", ("presets", "--show", "nosuch"), "no experiment preset named 'nosuch'"),
    Bad("presets-misspelled", ("presets", "--show", "tinyy"), "did you mean 'tiny-cpu'"),
    Bad("presets-path-escape", ("presets", "--show", "../../etc/passwd"), "no experiment preset named"),
    # head-bench
    Bad("head-bench-unknown-device", ("head-bench", "--device", "tpu"), "unknown device"),
    Bad("head-bench-hidden-zero", ("head-bench", "--hidden", "0"), "--hidden"),
    Bad("head-bench-hidden-text", ("head-bench", "--hidden", "big"), "--hidden"),
    Bad("head-bench-rows-text", ("head-bench", "--rows", "a,b"), "expected an integer"),
    Bad("head-bench-vocab-negative", ("head-bench", "--vocab", "-5"), "must be at least"),
    Bad("head-bench-fallback-above-one", ("head-bench", "--fallback", "1.5"), "between 0.0 and 1.0"),
    Bad("head-bench-repeats-zero", ("head-bench", "--repeats", "0"), "--repeats"),
    Bad("head-bench-output-exists", ("head-bench", "--output", "{tmp}/f"), "never overwritten", {"f": "x"}),
    Bad("head-bench-cuda-without-gpu", ("head-bench", "--device", "cuda"), "CUDA is not available"),
    # head-study
    Bad("head-study-missing-run", ("head-study", "--run", "{tmp}/nowhere"), "not a run directory"),
    Bad(
        "head-study-run-without-capture",
        ("head-study", "--run", "{tmp}/run"),
        "no captured head calls",
        setup=planted_run,
    ),
    Bad("head-study-k-negative", ("head-study", "--run", "{tmp}/run", "-k", "-1"), "-k", setup=planted_run),
    Bad(
        "head-study-group-size-text",
        ("head-study", "--run", "{tmp}/run", "--group-size", "abc"),
        "--group-size",
        setup=planted_run,
    ),
    # bench-overhead
    Bad("bench-overhead-tokens-zero", ("bench-overhead", "--tokens", "0"), "--tokens"),
    Bad("bench-overhead-rounds-negative", ("bench-overhead", "--rounds", "-1"), "--rounds"),
    Bad("bench-overhead-tokens-text", ("bench-overhead", "--tokens", "many"), "--tokens"),
    # images
    Bad(
        "images-build-unknown-name",
        ("images.build", "--name", "nosuch", "--dry-run"),
        "unknown name 'nosuch'",
    ),
    Bad(
        "images-build-unknown-engine",
        ("images.build", "--name", "transformers", "--engine", "lxc", "--dry-run"),
        "unknown engine 'lxc'",
    ),
    Bad(
        "images-build-torch-wheel-escapes",
        ("images.build", "--name", "transformers", "--torch-wheel", "../../etc/passwd", "--dry-run"),
        "must lie in .wheels/",
    ),
    Bad(
        "images-build-torch-wheel-missing",
        ("images.build", "--name", "transformers", "--torch-wheel", "nosuch.whl", "--dry-run"),
        "no wheel named nosuch.whl",
    ),
    Bad(
        "images-build-cuda-arch-shell",
        ("images.build", "--name", "vllm", "--cuda-arch", "9.0;touch {canary}", "--dry-run"),
        "not a CUDA architecture",
    ),
    Bad(
        "images-pull-unknown-name",
        ("images.pull", "--name", "nosuch", "--dry-run"),
        "unknown name 'nosuch'",
    ),
    Bad(
        "images-pull-unpublished",
        ("images.pull", "--name", "transformers", "--dry-run"),
        "no published digest",
    ),
    Bad(
        "images-push-unknown-name",
        ("images.push", "--name", "nosuch", "--to", "ghcr.io/me/x", "--dry-run"),
        "unknown name 'nosuch'",
    ),
    Bad(
        "images-push-not-a-reference",
        ("images.push", "--name", "transformers", "--to", "ghcr.io/me/x;touch {canary}", "--dry-run"),
        "not an image reference",
    ),
    Bad(
        "images-push-unknown-engine",
        ("images.push", "--name", "transformers", "--to", "ghcr.io/me/x", "--engine", "lxc", "--dry-run"),
        "unknown engine 'lxc'",
    ),
    Bad("images-lock-unknown-tool", ("images.lock", "--tool", "curl", "--check"), "unknown tool 'curl'"),
    Bad("images-list-unknown-engine", ("images.list", "--engine", "lxc"), "unknown engine 'lxc'"),
    # tiny.build
    Bad(
        "tiny-build-target-steps-zero",
        ("tiny.build", "--target-steps", "0", "--output", "{tmp}/t"),
        "--target-steps",
    ),
    Bad(
        "tiny-build-draft-steps-text",
        ("tiny.build", "--draft-steps", "few", "--output", "{tmp}/t"),
        "--draft-steps",
    ),
    Bad(
        "tiny-build-output-not-empty",
        ("tiny.build", "--output", "{tmp}/full"),
        "not empty",
        setup=_full_folder,
    ),
    Bad(
        "tiny-build-output-a-file",
        ("tiny.build", "--output", "{tmp}/f"),
        "exists and is not a folder",
        {"f": "x"},
    ),
    # demo
    Bad(
        "demo-output-exists",
        ("demo", "--output", "{tmp}/full", "--train-python", "{tmp}/python"),
        "exists",
        {"python": ""},
        setup=lambda t: (t / "full" / "logs").mkdir(parents=True),
    ),
    Bad(
        "demo-output-under-a-file",
        ("demo", "--output", "{tmp}/f/demo", "--train-python", "{tmp}/python"),
        "is a file",
        {"f": "x", "python": ""},
    ),
    Bad(
        "demo-train-python-missing",
        ("demo", "--output", "{tmp}/d", "--train-python", "{tmp}/nowhere/python"),
        "speculators",
    ),
    # reliability
    Bad("reliability-seed-text", ("reliability", "--seed", "lucky"), "--seed"),
    # evidence
    Bad(
        "evidence-verify-root-not-research",
        ("evidence.verify", "--root", "{tmp}/empty"),
        "not a research folder",
    ),
    Bad(
        "evidence-verify-tampered",
        ("evidence.verify", "--root", "{tmp}/research"),
        "SHA-256 differs",
        setup=_tampered_research,
    ),
    Bad(
        "evidence-add-no-study",
        ("evidence.add", "{tmp}/run", "--root", "{tmp}/research"),
        "--study: no value given",
        setup=lambda t: (_research_copy(t), planted_run(t)),
    ),
    Bad(
        "evidence-add-unknown-study",
        ("evidence.add", "{tmp}/run", "--study", "nosuch", "--root", "{tmp}/research"),
        "no study 'nosuch'",
        setup=lambda t: (_research_copy(t), planted_run(t)),
    ),
    Bad(
        "evidence-add-unfinished-run",
        ("evidence.add", "{tmp}/run", "--study", "tiny-cpu-aa", "--root", "{tmp}/research"),
        "still 'running'",
        setup=lambda t: (_research_copy(t), _killed_run(t)),
    ),
    Bad(
        "evidence-add-not-a-run",
        ("evidence.add", "{tmp}/empty", "--study", "tiny-cpu-aa", "--root", "{tmp}/research"),
        "neither a run directory",
        setup=_research_copy,
    ),
    # recover
    Bad("recover-missing-run", ("recover", "{tmp}/nowhere"), "not a run directory"),
    Bad("recover-a-finished-run", ("recover", "{tmp}/run"), "already ended", setup=planted_run),
    Bad(
        "recover-lock-other-host",
        ("recover", "{tmp}/run"),
        "ran on host elsewhere",
        setup=lambda t: planted_run(
            t, killed=True, lock={"host": "elsewhere", "step": {"name": "b", "pgid": 4000000}}
        ),
    ),
    # share
    Bad(
        "share-missing-run", ("share", "{tmp}/nowhere", "--output", "{tmp}/b.tar.gz"), "no such run directory"
    ),
    Bad(
        "share-output-exists",
        ("share", "{tmp}/run", "--output", "{tmp}/f"),
        "already exists",
        {"f": "x"},
        setup=planted_run,
    ),
    Bad(
        "share-records-fifo",
        ("share", "{tmp}/run", "--output", "{tmp}/b.tar.gz"),
        "named pipe",
        setup=lambda t: planted_run(t, fifo="records.jsonl"),
    ),
    Bad(
        "share-run-id-with-newline",
        ("share", "{tmp}/run", "--output", "{tmp}/b.tar.gz"),
        "is not a run id",
        setup=lambda t: planted_run(t, manifest=lambda d: d.update(run_id="run\n")),
    ),
    # analyze
    Bad("analyze-missing-run", ("analyze", "{tmp}/nowhere"), "not a run directory"),
    Bad(
        "analyze-manifest-a-list",
        ("analyze", "{tmp}/run"),
        "expected a JSON object",
        setup=_manifest_as("[]"),
    ),
    Bad(
        "analyze-records-link-out",
        ("analyze", "{tmp}/run"),
        "link pointing out",
        setup=lambda t: planted_run(t, link_out="records.jsonl"),
    ),
    Bad(
        "analyze-report-exists",
        ("analyze", "{tmp}/run", "--report", "{tmp}/empty"),
        "already exists",
        setup=planted_run,
    ),
    # compare
    Bad(
        "compare-missing-candidate",
        ("compare", "{tmp}/run", "{tmp}/nowhere", "--output", "{tmp}/c.json"),
        "not a run directory",
        setup=planted_run,
    ),
    Bad(
        "compare-resamples-zero",
        ("compare", "{tmp}/run", "{tmp}/run2", "--resamples", "0", "--output", "{tmp}/c.json"),
        "must be at least 1",
        setup=_two_runs,
    ),
    Bad(
        "compare-threshold-text",
        ("compare", "{tmp}/run", "{tmp}/run2", "--threshold", "lots", "--output", "{tmp}/c.json"),
        "expected a percentage",
        setup=_two_runs,
    ),
    Bad(
        "compare-output-exists",
        ("compare", "{tmp}/run", "{tmp}/run2", "--output", "{tmp}/f"),
        "already exists",
        {"f": "x"},
        setup=_two_runs,
    ),
    # reproduce
    Bad(
        "reproduce-missing-run",
        ("reproduce", "{tmp}/nowhere", "--output", "{tmp}/new"),
        "not a run directory",
    ),
    Bad(
        "reproduce-output-exists",
        ("reproduce", "{tmp}/run", "--output", "{tmp}/empty"),
        "already exists",
        setup=planted_run,
    ),
    Bad(
        "reproduce-prompts-deleted",
        ("reproduce", "{tmp}/run", "--output", "{tmp}/new"),
        "no copy of its prompt file",
        setup=_inputs_deleted,
    ),
    Bad(
        "reproduce-prompts-edited",
        ("reproduce", "{tmp}/run", "--output", "{tmp}/new"),
        "no longer has the hash",
        setup=lambda t: (
            planted_run(t),
            (t / "run" / "inputs" / "prompts.json").write_text(
                '{"schema_version": 1, "name": "x", "prompts": []}'
            ),
        ),
    ),
    # version / doctor take no values; benchmark's and pipeline's remaining options
    Bad("benchmark-head-unknown", bench(head="dense2"), "--head: unknown head 'dense2'"),
    Bad("benchmark-capture-head-negative", bench(capture_head="-1"), "--capture-head: must be at least 0"),
    Bad("benchmark-dtype-unknown", bench(dtype="float8"), "--dtype: unknown dtype 'float8'"),
    Bad("benchmark-executor-unknown", bench(executor="k8s"), "unknown executor 'k8s'"),
    Bad("benchmark-partition-newline", bench(executor="slurm", partition="gpu\n"), "a Slurm partition"),
    Bad("pipeline-executor-unknown", pipe("--executor", "k8s"), "unknown executor 'k8s'"),
    Bad("pipeline-config-missing", pipe("--config", "{tmp}/nowhere.yaml"), "run config not found"),
    Bad(
        "pipeline-config-a-list",
        pipe("--config", "{tmp}/c.yaml"),
        "expected a mapping",
        {"c.yaml": "- a\n- b\n"},
    ),
    Bad("pipeline-unknown-preset", pipe(preset="nosuch"), "no model preset named 'nosuch'"),
    Bad(
        "pipeline-chat-rows-fifo",
        pipe("--opts", "data.chat={tmp}/fifo"),
        "not a regular file",
        setup=_fifo("fifo"),
    ),
]
CASES += EVERY_COMMAND


def snapshot(folder: Path, ignore: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    return {
        rel: (p.read_bytes() if p.is_file() and p.stat().st_size < 2**20 else None)
        for p in sorted(folder.rglob("*"))
        if not (rel := str(p.relative_to(folder))).startswith(ignore)
    }


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    state_kept: bool
    canary: bool


def attempt(case: Bad, folder: Path) -> Outcome:
    folder.mkdir()
    canary = folder / "CANARY"
    values = {"{tmp}": str(folder), "{run}": str(folder / "run"), "{canary}": str(canary)}

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, value)
        return text

    for name, content in case.files.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    if case.setup is not None:
        case.setup(folder)
    (folder / "empty").mkdir(exist_ok=True)
    ignore = ("graph", "runroot")  # podman's own (empty) image store, created by podman itself
    before = snapshot(folder, ignore)
    result = run_invoke(*map(fill, case.args), env={k: fill(v) for k, v in case.env.items()}, timeout=120)
    return Outcome(
        result.returncode, result.stdout, result.stderr, snapshot(folder, ignore) == before, canary.exists()
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case run once, three at a time (each is a fresh `invoke` process; most of their time is start-up)."""
    root = tmp_path_factory.mktemp("bad")
    runnable = [c for c in CASES if not c.needs or shutil.which(c.needs)]
    with ThreadPoolExecutor(3) as pool:
        done = pool.map(lambda c: attempt(c, root / c.id), runnable)
        return {c.id: o for c, o in zip(runnable, done, strict=True)}


# The first case's setup runs the whole corpus (the module fixture): ~200 processes, each bounded by run_invoke's
# own 120 s, under a limit that fits the corpus rather than one case.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case: Bad, outcomes, figures):
    if case.id not in outcomes:
        unavailable(f"{case.needs} is not installed here")
    out = outcomes[case.id]
    refused = False
    try:
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode != 0, out.stdout[-1500:]
        assert "Traceback" not in out.stderr, out.stderr[-3000:]
        assert len(lines) == 1, out.stderr
        assert lines[0].startswith("error:") and case.expect in lines[0], lines[0]
        assert out.state_kept, "the refused command left state behind"
        assert not out.canary, "a value reached a shell"
        refused = True
    finally:
        figures.bad_input(case.id, refused)
