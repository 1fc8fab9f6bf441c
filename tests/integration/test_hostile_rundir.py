"""Hostile run directories (issue 18, acceptance 1): nothing read from a run directory is trusted.

For each command that reads a run — recover, validate, analyze, compare, share, reproduce — a run directory is
planted whose lock, manifest and records name programs (a canary that leaves a file if it ever runs, on PATH by
name and named by its absolute path) and paths outside the run (`../../escape`, absolute paths, links out of it,
named pipes). Each case runs the real command line and checks that

- the canary never ran,
- nothing was written outside the command's own output (the whole test folder is snapshotted before and after,
  without following a link or opening a pipe),
- the answer is a clean refusal (a non-zero exit, one line on stderr, no traceback) naming the problem, or a
  success that ignored the hostile value.

The planted runs start from a run the kit's own RunDir made (schema-valid, with its lock), so each case differs
from a real run only by what it plants. Fast: no model runs (about 25 fresh `invoke` processes, three at a time).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_analysis_synthetic import make_run

from support import ROOT, run_invoke

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # 31 fresh `invoke` processes in its fixture

CANARY = "canary"  # the planted program's name on PATH


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # {run}: the planted run; {out}: the command's output folder; {world}, {canary}
    plant: Callable[[Path, Path], None]  # (run, world)
    expect: str | None  # a phrase of the refusal; None: the command must succeed
    output: tuple[
        str, ...
    ] = ()  # paths (relative to the world) the command may write, besides the run itself
    writes_run: bool = False  # recover writes the run's record: the run is its output
    check: Callable[[Path], None] | None = None  # more checks on a success, given the world
    base: str = "done"  # which prepared run to start from: done (completed) or killed (running, lock left)
    extra: tuple[str, ...] = field(default_factory=tuple)  # more runs to copy in, by base name


# --- planting -------------------------------------------------------------------------------------------------


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def manifest(change: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    return lambda run, world: edit_json(run / "manifest.json", change)


def lock(**facts) -> Callable[[Path, Path], None]:
    """The lock's facts replaced (`{canary}` becomes the canary's absolute path once planted)."""

    def plant(run: Path, world: Path) -> None:
        info = json.loads((run / ".supervisor").read_text())
        info.update(facts)
        (run / ".supervisor").write_text(json.dumps(info))

    return plant


def link_out(name: str, torn: bool = False) -> Callable[[Path, Path], None]:
    """`run/name` becomes a link to a copy of itself outside the run (the copy must stay byte-identical)."""

    def plant(run: Path, world: Path) -> None:
        outside = world / f"outside-{Path(name).name}"
        outside.write_bytes((run / name).read_bytes() + (b'{"torn' if torn else b""))
        (run / name).unlink()
        (run / name).symlink_to(outside)

    return plant


def fifo(name: str) -> Callable[[Path, Path], None]:
    def plant(run: Path, world: Path) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)

    return plant


def hostile_strings(doc: dict) -> None:
    """Programs and escaping paths in every free-text field a manifest has: data, to be shown or packed, never run."""
    doc["command_line"] = ["{canary}", "--output", "../../escape", "/abs/escape"]
    doc["notes"] = ["run {canary}", "$(touch ../../escape)", "`{canary}`"]
    doc["steps"] = [
        {"name": "benchmark", "status": "completed", "argv": ["{canary}", "--run-dir", "../../escape"]}
    ]
    doc["kit"]["version"] = "../../escape"


def plant_all(*plants: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def plant(run: Path, world: Path) -> None:
        for one in plants:
            one(run, world)

    return plant


def records_hostile(run: Path, world: Path) -> None:
    lines = []
    for line in (run / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["prompt_id"] = "../../escape"
        record["extra"] = {"program": "{canary}", "path": "/abs/escape"}
        lines.append(json.dumps(record))
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")


def restamp(run: Path, world: Path) -> None:
    """The summary written again from the planted records, as the supervisor writes it (records' SHA-256
    included): the run then follows from its records, so the case tests the hostile strings, not the integrity
    check (an edited record without this is refused: `analyze-edited-records`)."""
    from draftscope.core import integrity

    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    again = integrity.recompute(summary, records, integrity.prompt_ids(run))
    again["records_sha256"] = integrity.records_sha256(run)
    (run / "summary.json").write_text(json.dumps(again))


def killed(change: Callable[[dict], None] | None = None) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        doc.update(status="running", reason=None, finished_at=None)
        if change:
            change(doc)

    return edit


# --- the cases ------------------------------------------------------------------------------------------------

ABS_CANARY = "{canary}"
CASES = [
    # recover: the lock and the manifest name programs and processes
    Case(
        "recover-lock-engine-absolute",
        ("recover", "{run}"),
        lock(step={"name": "benchmark", "engine": ABS_CANARY}),
        "step.engine: names a program that is not a container engine",
        base="killed",
    ),
    Case(
        "recover-lock-engine-on-path",
        ("recover", "{run}", "--force"),
        lock(step={"name": "benchmark", "engine": CANARY}),
        "step.engine",
        base="killed",
    ),
    Case(
        "recover-lock-pgid-not-a-number",
        ("recover", "{run}"),
        lock(step={"name": "benchmark", "pgid": "-1; touch ../../escape"}),
        "step.pgid: must be",
        base="killed",
    ),
    Case(
        "recover-lock-pgid-of-another-process",
        ("recover", "{run}"),
        lock(step={"name": "benchmark", "pgid": os.getpgid(0)}),
        "cannot be confirmed to be this run's",
        base="killed",
    ),
    Case(
        "recover-lock-without-host",
        ("recover", "{run}"),
        lock(host=None, step={"name": "benchmark", "pgid": os.getpgid(0)}),
        "records no host",
        base="killed",
    ),
    Case(
        "recover-lock-a-list",
        ("recover", "{run}", "--force"),
        lambda run, world: (run / ".supervisor").write_text("[1]"),
        None,
        writes_run=True,
        base="killed",
    ),
    Case(
        "recover-lock-links-out",
        ("recover", "{run}", "--force"),
        link_out(".supervisor"),
        "symbolic link",
        base="killed",
    ),
    Case(
        "recover-records-link-out",
        ("recover", "{run}", "--force"),
        link_out("records.jsonl", torn=True),
        "symbolic link",
        base="killed",
    ),
    Case(
        "recover-manifest-runtime-a-program",
        ("recover", "{run}"),
        manifest(killed(lambda d: d["config"].update(runtime=ABS_CANARY))),
        "$.runtime",
        base="killed",
    ),
    Case(
        "recover-manifest-without-status",
        ("recover", "{run}"),
        manifest(lambda d: d.pop("status")),
        "status",
        base="killed",
    ),
    Case(
        "recover-hostile-strings",
        ("recover", "{run}"),
        manifest(killed(hostile_strings)),
        None,
        writes_run=True,
        base="killed",
    ),
    # validate: the files it enumerates
    Case(
        "validate-records-a-pipe",
        ("validate", "{run}"),
        fifo("records.jsonl"),
        "records.jsonl is a named pipe",
    ),
    Case("validate-summary-links-out", ("validate", "{run}"), link_out("summary.json"), "link pointing out"),
    Case(
        "validate-manifest-a-list",
        ("validate", "{run}"),
        lambda run, world: (run / "manifest.json").write_text("[]"),
        "is not of type 'object'",
    ),
    Case(
        "validate-manifest-link-loop",
        ("validate", "{run}"),
        lambda run, world: (
            (run / "manifest.json").unlink(),
            (run / "manifest.json").symlink_to("manifest.json"),
        ),
        "cannot be read",
    ),
    Case(
        "validate-inputs-deleted",
        ("validate", "{run}"),
        lambda run, world: shutil.rmtree(run / "inputs"),
        "the run's copy of its prompts input was deleted",
    ),
    # analyze
    Case("analyze-records-link-out", ("analyze", "{run}"), link_out("records.jsonl"), "link pointing out"),
    Case(
        "analyze-hostile-strings",
        ("analyze", "{run}", "--report", "{out}/rep"),
        plant_all(manifest(hostile_strings), records_hostile, restamp),
        None,
        output=("out",),
    ),
    Case(
        "analyze-edited-records",
        ("analyze", "{run}", "--report", "{out}/rep"),
        records_hostile,
        "$.records_sha256",
    ),
    # compare
    Case(
        "compare-run-id-escapes",
        ("compare", "{run}", "{world}/done2"),
        manifest(lambda d: d.update(run_id="../../escape")),
        "$.run_id",
        extra=("done2",),
    ),
    Case(
        "compare-unfinished",
        ("compare", "{world}/done2", "{run}", "--output", "{out}/c.json"),
        plant_all(
            manifest(lambda d: d.update(status="interrupted", reason="killed")),
            lambda run, world: edit_json(run / "summary.json", lambda d: d.update(partial=True)),
        ),
        "is unfinished",
        extra=("done2",),
    ),
    Case(
        "compare-hostile-strings",
        ("compare", "{world}/done2", "{run}", "--output", "{out}/c.json", "--resamples", "200"),
        manifest(hostile_strings),
        None,
        output=("out",),
        extra=("done2",),
    ),
    # share
    Case(
        "share-run-id-escapes",
        ("share", "{run}", "--output", "{out}/b.tar.gz"),
        manifest(lambda d: d.update(run_id="../../escape")),
        "$.run_id: is not a run id",
    ),
    Case(
        "share-run-id-absolute",
        ("share", "{run}", "--output", "{out}/b.tar.gz"),
        manifest(lambda d: d.update(run_id="/abs/escape")),
        "$.run_id: is not a run id",
    ),
    Case(
        "share-manifest-links-out",
        ("share", "{run}", "--output", "{out}/b.tar.gz"),
        link_out("manifest.json"),
        "link pointing out",
    ),
    Case(
        "share-links-and-pipes-inside",
        ("share", "{run}", "--include-text", "--output", "{out}/b.tar.gz"),
        lambda run, world: (
            (run / "logs" / "x.log").symlink_to(world / "secret"),
            (run / "logs" / "up").symlink_to(world, target_is_directory=True),
            os.mkfifo(run / "logs" / "pipe"),
        ),
        None,
        output=("out",),
        check=lambda world: check_bundle(world / "out" / "b.tar.gz"),
    ),
    # reproduce: the manifest's config and inputs become a plan and an argv
    Case(
        "reproduce-runtime-a-program",
        ("reproduce", "{run}", "--output", "{out}/new"),
        manifest(lambda d: d["config"].update(runtime=ABS_CANARY)),
        "$.runtime",
    ),
    Case(
        "reproduce-backend-a-program",
        ("reproduce", "{run}", "--output", "{out}/new"),
        manifest(lambda d: d["config"].update(backend=CANARY)),
        "canary",
    ),
    Case(
        "reproduce-prompts-link-out",
        ("reproduce", "{run}", "--output", "{out}/new"),
        link_out("inputs/prompts.json"),
        "link pointing out",
    ),
    Case(
        "reproduce-input-names-no-file",
        ("reproduce", "{run}", "--output", "{out}/new"),
        manifest(lambda d: d["inputs"][0].update(path="/abs/escape/..")),
        "names no prompt file",
    ),
    Case(
        "reproduce-run-id-escapes",
        ("reproduce", "{run}", "--output", "{out}/new"),
        manifest(lambda d: d.update(run_id="../../escape")),
        "$.run_id",
    ),
]


def check_bundle(path: Path) -> None:
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            assert member.isfile() and not member.name.startswith("/") and ".." not in parts, member.name
            assert parts[0] == "run" and not {"x.log", "up", "pipe"} & set(parts), member.name
            assert b"secret outside the run" not in tar.extractfile(member).read()


# --- running --------------------------------------------------------------------------------------------------


def snapshot(root: Path, skip: tuple[Path, ...]) -> dict[str, object]:
    """Every entry under `root` (links not followed, pipes not opened): its kind and, for a file, its bytes."""
    found: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            if any(path == s or path.is_relative_to(s) for s in skip):
                continue
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                found[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[str(path)] = path.read_bytes()
            else:
                found[str(path)] = stat.S_IFMT(mode)
    return found


@dataclass
class Outcome:
    returncode: int | None  # None: it hung
    stdout: str
    stderr: str
    changed: list[str]
    canary: bool
    world: Path


def attempt(case: Case, world: Path, prepared: dict[str, Path]) -> Outcome:
    world.mkdir()
    (world / "bin").mkdir()
    mark = world / "CANARY-RAN"
    program = world / "bin" / CANARY
    program.write_text(f"#!/bin/sh\ntouch {mark}\necho 0123456789abcdef\n")
    program.chmod(0o755)
    (world / "secret").write_text("secret outside the run\n")
    (world / "cwd").mkdir()
    (world / "out").mkdir()
    run = (
        world / "c" / "x" / "run"
    )  # ../../escape from the run lands in the world, where the snapshot sees it
    shutil.copytree(prepared[case.base], run, symlinks=True)
    for name in case.extra:
        shutil.copytree(prepared[name], world / name, symlinks=True)
    case.plant(run, world)
    for path in (run / "manifest.json", run / ".supervisor"):
        if path.is_file() and not path.is_symlink():  # the canary's absolute path, where a case names it
            path.write_text(path.read_text().replace("{canary}", str(program)))
    skip = tuple(world / o for o in case.output) + ((run,) if case.writes_run else ())
    before = snapshot(world, skip)
    values = {"{run}": str(run), "{out}": str(world / "out"), "{world}": str(world), "{canary}": str(program)}
    args = []
    for arg in case.args:
        for key, value in values.items():
            arg = arg.replace(key, value)
        args.append(arg)
    env = {"PATH": f"{world / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    # From a folder of the test's own (where a default output would land), the kit's tasks named by -r.
    try:
        result = run_invoke("-r", str(ROOT), *args, cwd=world / "cwd", env=env, timeout=60)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    except subprocess.TimeoutExpired:  # a reader blocked on a planted pipe: the command hung
        code, stdout, stderr = None, "", "the command hung (no answer within 60 s)"
    after = snapshot(world, skip)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Outcome(code, stdout, stderr, changed, mark.exists(), world)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("hostile")
    prepared = {
        "done": make_run(root / "prepared" / "run", repeats=1),
        "done2": make_run(root / "prepared2" / "done2", repeats=1, seed=3),
    }
    killed_run = root / "prepared-killed" / "run"
    shutil.copytree(prepared["done"], killed_run)
    edit_json(killed_run / "manifest.json", killed())
    (killed_run / "summary.json").unlink()
    # The lock a supervisor killed by SIGKILL leaves: its facts, nobody holding it.
    lock_facts = {"pid": 4_000_000, "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z"}
    (killed_run / ".supervisor").write_text(json.dumps(lock_facts))
    prepared["killed"] = killed_run
    with ThreadPoolExecutor(3) as pool:
        done = pool.map(lambda c: attempt(c, root / c.id, prepared), CASES)
        return {c.id: o for c, o in zip(CASES, done, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_run_directory_is_refused_or_ignored(case: Case, outcomes):
    out = outcomes[case.id]
    said = out.stdout[-2000:] + out.stderr[-3000:]
    assert not out.canary, f"the planted program ran: {said}"
    assert out.returncode is not None, out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.changed == [], f"written outside the command's output: {out.changed}"
    if case.expect is None:
        assert out.returncode == 0, said
        if case.check is not None:
            case.check(out.world)
        return
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode != 0, said
    assert len(lines) == 1, out.stderr
    # `validate` reports its verdicts on stdout and ends with one line; every other command's refusal is `error:`
    assert lines[0].startswith("error:") or case.args[0] == "validate", lines[0]
    assert case.expect in (lines[0] if case.args[0] != "validate" else out.stdout), said
