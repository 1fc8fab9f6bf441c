"""`invoke share`: the bundle holds no prompt or generated text unless asked, and never touches the run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tarfile

import pytest

from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.validate import validate_run
from draftscope.ops.share import TEXT_FIELDS, HostPaths, pack, redact
from draftscope.runtime.step import CACHE_MOUNT, RUN_MOUNT

from support import run_invoke, tiny_benchmark

CANARY = "periwinkle-canary-4417"
GENERATED = "the ostrich sings in base64"


def host():
    return {
        "gpus": [],
        "gpu_source": None,
        "engines": [],
        "toolkit": {},
        "memory": None,
        "verdict": ["no GPU"],
        "disk": {"path": "/home/someone/secret-project"},
    }


def make_run(folder, *, torn=False):
    """A run directory as the supervisor leaves it, with text planted wherever a run can hold it."""
    run = folder / "R1"
    (run / "inputs").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "head").mkdir()
    prompts = {
        "schema_version": 1,
        "name": "p",
        "prompts": [{"id": "p1", "messages": [{"role": "user", "content": f"Tell me about {CANARY}."}]}],
    }
    (run / "inputs" / "prompts.json").write_text(json.dumps(prompts))
    (run / "logs" / "benchmark.log").write_text(f"generated: {GENERATED}\n")
    (run / "head" / "capture.json").write_text(json.dumps({"calls": [{"next_token": 17}]}))
    (run / ".space-reserve").write_bytes(bytes(16))
    manifest = {
        "schema_version": 1,
        "kind": "benchmark",
        "run_id": "R1",
        "status": "completed",
        "config": {"backend": "transformers", "prompts": "p.json", "repeats": 1},
        "hardware": {"device": "cpu", "cpu_count": 2},
        "kit": {"version": "0.1.0"},
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    (run / "summary.json").write_text(json.dumps({"run_id": "R1", "records": 2, "greedy_agreement": True}))
    (run / "worker.json").write_text(json.dumps({"hardware": {"torch_threads": 2}, "phase": "done"}))
    extra = {
        "head": {"fallbacks": 1},
        "generated_text": GENERATED,
        "steps": [{"text": GENERATED, "accepted": 2}],
    }
    records = [
        {
            "prompt_id": "p1",
            "repeat": r,
            "generated_token_ids": [901, 902, 903, 904],
            "generated_tokens": 4,
            "request_seconds": 0.5,
            "extra": extra,
        }
        for r in range(2)
    ]
    lines = "".join(json.dumps(r) + "\n" for r in records)
    if torn:
        lines += '{"prompt_id": "p1", "generated_text": "' + GENERATED[:9]  # a killed writer's last line
    (run / "records.jsonl").write_text(lines)
    return run


USER = "zelda-quill"  # the user name segment of the planted paths
CLUSTER = "/srv/cluster-7/groups"  # a path outside both the run and the home directory
MOVED = "/nfs/old-host/scratch"  # where the run directory was when it ran (it was moved since)


def make_pathy_run(tmp_path, monkeypatch):
    """A run whose manifest, worker facts, summary and records hold paths of the host, as real runs do: under the
    run directory (where it is now, and where it was when it ran), under a home directory, elsewhere, in argv words
    (`--flag=/path`, `SRC:TARGET:MODE`, `KEY=/path`), in messages; next to the containers' own paths."""
    home = tmp_path / "home" / USER
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    run = make_run(tmp_path / "lab")
    manifest = json.loads((run / "manifest.json").read_text())
    prompts = f"{home}/data/my prompts.json"  # a space in an argv word
    manifest |= {
        "command_line": [
            "invoke",
            "benchmark",
            "--prompts",
            prompts,
            f"--output={run}",
            "--cache",
            f"{CLUSTER}/{USER}/hf",
            "--draft",
            "tiny",
        ],
        "config": {**manifest["config"], "prompts": prompts},
        "inputs": [
            {"name": "prompts", "path": prompts, "sha256": "ab" * 32, "bytes": 10},
            {
                "name": "extra",
                "path": f"{MOVED}/{USER}/R1/inputs/extra.json",
                "sha256": "cd" * 32,
                "bytes": 3,
            },
        ],
        "reason": f"could not read {CLUSTER}/{USER}/shared.json: permission denied",
        "notes": [
            f"log at {run}/logs/benchmark.log",
            "decode tok/s stays within 2%",
            "see https://example.org/a/b",
        ],
        "steps": [
            {
                "name": "benchmark",
                "log": f"{run}/logs/benchmark.log",
                "argv": [
                    "docker",
                    "run",
                    "--volume",
                    f"{MOVED}/{USER}/R1:{RUN_MOUNT}:rw",
                    "--volume",
                    f"{home}/.cache/huggingface/hub:{CACHE_MOUNT}:ro",
                    "--env",
                    f"HF_HUB_CACHE={CACHE_MOUNT}",
                    "--env",
                    "HOME=/tmp/home",
                    "--workdir",
                    "/tmp",
                    "localhost/draftscope-transformers:0.1.0",
                    "python",
                    "-m",
                    "draftscope",
                    "worker",
                    "benchmark",
                    "--run-dir",
                    RUN_MOUNT,
                ],
            },
            {
                "name": "local",
                "argv": [
                    f"{home}/venvs/ds/bin/python3",
                    "-m",
                    "draftscope",
                    "worker",
                    "benchmark",
                    f"--run-dir={run}",
                    f"--cache={CLUSTER}/{USER}/hf/hub",
                ],
            },
        ],
    }
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    worker = {"hardware": {"torch_threads": 2}, "phase": "done", "cache": f"{home}/.cache/torch/kernels"}
    (run / "worker.json").write_text(json.dumps(worker))
    summary = {"run_id": "R1", "records": 2, "source": f"{run}/records.jsonl"}
    (run / "summary.json").write_text(json.dumps(summary))
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for record in records:
        record["extra"]["kernel_cache"] = f"{CLUSTER}/{USER}/triton/{record['repeat']}"
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run, home


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def members(bundle):
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_redact_removes_text_fields_at_any_depth():
    record = {"a": 1, "generated_token_ids": [1], "extra": {"text": "x", "n": [{"messages": [], "k": 2}]}}
    out, removed = redact(record)
    assert out == {"a": 1, "extra": {"n": [{"k": 2}]}}
    assert removed == {"generated_token_ids", "text", "messages"} <= TEXT_FIELDS


def test_bundle_has_no_text_by_default_and_checks_out(tmp_path):
    run = make_run(tmp_path, torn=True)
    before = snapshot(run)
    bundle = pack(run, tmp_path / "b.tar.gz", collect=host)
    assert snapshot(run) == before, "packing must not change the run directory"
    files = members(tmp_path / "b.tar.gz")
    assert sorted(files) == [
        f"R1/{n}"
        for n in (
            "SHA256SUMS",
            "SHARE.json",
            "config.json",
            "hardware.json",
            "manifest.json",
            "records.jsonl",
            "summary.json",
            "worker.json",
        )
    ]
    blob = b"\n".join(files.values())
    for needle in (CANARY, GENERATED, GENERATED[:9], "901, 902", "/home/someone"):
        assert needle.encode() not in blob, needle
    assert b"generated_token_ids" not in files["R1/records.jsonl"]
    records = [json.loads(line) for line in files["R1/records.jsonl"].splitlines()]
    assert [r["repeat"] for r in records] == [0, 1]
    assert records[0]["extra"] == {"head": {"fallbacks": 1}, "steps": [{"accepted": 2}]}
    share = json.loads(files["R1/SHARE.json"])
    assert share["records"] == {
        "kept": 2,
        "incomplete_lines_left_out": 1,
        "fields_removed": ["generated_text", "generated_token_ids", "text"],
    }
    assert share["left_out"] == ["head/capture.json", "inputs/prompts.json", "logs/benchmark.log"]
    assert json.loads(files["R1/config.json"])["backend"] == "transformers"
    hardware = json.loads(files["R1/hardware.json"])
    assert hardware["run"] == {"device": "cpu", "cpu_count": 2} and hardware["worker"] == {"torch_threads": 2}
    sums = dict(reversed(line.split("  ")) for line in files["R1/SHA256SUMS"].decode().splitlines())
    assert set(sums) == {n.removeprefix("R1/") for n in files} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256(files[f"R1/{name}"]).hexdigest() == digest
    assert bundle.records == 2 and bundle.torn_lines == 1


def test_include_text_packs_everything_of_the_run(tmp_path):
    run = make_run(tmp_path)
    pack(run, tmp_path / "b.tar.gz", include_text=True, collect=host)
    files = members(tmp_path / "b.tar.gz")
    assert {"R1/inputs/prompts.json", "R1/logs/benchmark.log", "R1/head/capture.json"} <= set(files)
    assert "R1/.space-reserve" not in files
    assert CANARY.encode() in files["R1/inputs/prompts.json"]
    assert b"generated_token_ids" in files["R1/records.jsonl"]


def test_archive_members_are_plain_and_fixed(tmp_path):
    pack(make_run(tmp_path), tmp_path / "b.tar.gz", collect=host)
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        for m in tar.getmembers():
            assert m.isfile() and (m.mode, m.mtime, m.uid, m.gid, m.uname) == (0o644, 0, 0, 0, "")
    assert (tmp_path / "b.tar.gz").read_bytes()[4:8] == bytes(4), "gzip header without a timestamp"


def test_refusals_leave_everything_unchanged(tmp_path):
    run = make_run(tmp_path)
    existing = tmp_path / "old.tar.gz"
    existing.write_bytes(b"keep me")
    with pytest.raises(UserError, match="already exists"):
        pack(run, existing, collect=host)
    assert existing.read_bytes() == b"keep me"
    with pytest.raises(UserError, match="inside the run directory"):
        pack(run, run / "b.tar.gz", collect=host)
    with pytest.raises(UserError, match="folder does not exist"):
        pack(run, tmp_path / "nope" / "b.tar.gz", collect=host)
    workdir = tmp_path / "W"
    (workdir / "stages").mkdir(parents=True)
    (workdir / "pipeline.json").write_text("{}")
    with pytest.raises(UserError, match="pipeline workdir"):
        pack(workdir, tmp_path / "w.tar.gz", collect=host)
    with pytest.raises(UserError, match="no such run directory"):
        pack(tmp_path / "missing", tmp_path / "m.tar.gz", collect=host)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R1", "W", "old.tar.gz"]


@pytest.mark.parametrize(
    "name, fix",
    [
        ("bundle.zip", "bundle.tar.gz"),
        ("bundle.tar", "bundle.tar.gz"),
        ("bundle.tar.xz", "bundle.tar.gz"),
        ("bundle", "bundle.tar.gz"),
        ("run.json.gz", "run.json.tar.gz"),
    ],
)
def test_a_name_that_says_another_format_is_refused_naming_the_fix(tmp_path, name, fix):
    run = make_run(tmp_path)
    with pytest.raises(UserError) as err:
        pack(run, tmp_path / name, collect=host)
    line = err.value.render()
    # the value in full on the error (the line shortens a long one to 80 characters: tmp paths under xdist are)
    assert "gzip'd tar" in line and "--output" in line and err.value.value == str(tmp_path / name), line
    assert f"fix: name it {tmp_path / fix}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R1"]


@pytest.mark.parametrize("name", ["b.tgz", "B.TAR.GZ"])
def test_a_tgz_name_is_a_gzipd_tar_too(tmp_path, name):
    pack(make_run(tmp_path), tmp_path / name, collect=host)
    with tarfile.open(tmp_path / name, "r:gz") as tar:
        assert "R1/manifest.json" in tar.getnames()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["R1"], "--output"),
        (["R1", "--output", "old.tar.gz"], "already exists"),
        (["missing", "--output", "x.tar.gz"], "no such run directory"),
        (["R1", "--output", "bundle.zip"], "(got 'bundle.zip'); fix: name it bundle.tar.gz"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, needle):
    make_run(tmp_path)
    (tmp_path / "old.tar.gz").write_bytes(b"keep me")
    from support import ROOT

    done = run_invoke("--search-root", str(ROOT), "share", *args, cwd=tmp_path)
    assert done.returncode == 2
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and needle in err, err


# --- a real tiny run --------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_tiny_run_bundle_holds_no_prompt_or_generated_text(tmp_path):
    """The acceptance check: a real CPU run of the tiny models, packed, then searched for its own text."""
    from draftscope import tiny

    prompts = tmp_path / "prompts.json"
    texts = [f"Explain the {CANARY} protocol in one sentence.", f"Write a haiku about {CANARY} rivers."]
    prompts.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": "canaries",
                "prompts": [
                    {"id": f"c{i}", "messages": [{"role": "user", "content": t}]} for i, t in enumerate(texts)
                ],
            }
        )
    )
    run = tmp_path / "run"
    args = [a for a in tiny_benchmark("local") if a != "examples/prompts.json"]
    args[args.index("--prompts") + 1 : args.index("--prompts") + 1] = [str(prompts)]
    done = run_invoke(
        *args,
        "--output",
        str(run),
        "--repeats",
        "1",
        "--max-new-tokens",
        "24",
        "--draft",
        "tiny",
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    done = run_invoke("share", str(run), "--output", str(tmp_path / "b.tar.gz"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "text removed (generated_token_ids)" in done.stdout

    tokenizer = tiny.load_tokenizer()
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    generated = [tokenizer.decode(r["generated_token_ids"], skip_special_tokens=True) for r in records]
    files = members(tmp_path / "b.tar.gz")
    blob = b"\n".join(files.values()).decode("utf-8")
    assert CANARY not in blob
    for text in generated:
        longest = max(re.split(r"\s{2,}|\n", text), key=len).strip()
        assert len(longest) < 12 or longest not in blob, longest
    for r in records:
        ids = r["generated_token_ids"]
        for i in range(0, max(1, len(ids) - 6)):
            assert ", ".join(map(str, ids[i : i + 6])) not in blob
    assert b"generated_token_ids" not in files["run/records.jsonl"]
    # No path of this host either: the run's folder, the prompt file's and the interpreter's are rewritten.
    from support import ROOT

    recorded = (run / "manifest.json").read_text()
    assert str(tmp_path) in recorded and sys.executable in recorded
    for prefix in (str(tmp_path), str(ROOT), os.path.dirname(sys.executable)):
        assert prefix not in blob, prefix
    manifest = json.loads(checked(files, "run")["run/manifest.json"])
    assert manifest["inputs"][0]["path"] == "…/prompts.json" and "--run-dir" in manifest["steps"][0]["argv"]
    assert manifest["steps"][0]["argv"][-2:] == ["--run-dir", "<run>"]
    assert schema.problems(manifest, "run-manifest") == []
    # The same search finds the text when it is asked for.
    done = run_invoke(
        "share", str(run), "--output", str(tmp_path / "t.tar.gz"), "--include-text", timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert CANARY in b"\n".join(members(tmp_path / "t.tar.gz").values()).decode("utf-8")
    # Unpacked, the whole bundle is a valid run directory: the prompt copy still has the manifest's hash.
    with tarfile.open(tmp_path / "t.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    report = validate_run(tmp_path / "unpacked" / "run")
    assert report.ok, [v.line() for v in report.verdicts]


# --- host paths -------------------------------------------------------------------------------------------------


def checked(files, top="R1"):
    """The bundle's members after checking them against its SHA256SUMS."""
    sums = dict(reversed(line.split("  ")) for line in files[f"{top}/SHA256SUMS"].decode().splitlines())
    assert set(sums) == {n.removeprefix(f"{top}/") for n in files} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256(files[f"{top}/{name}"]).hexdigest() == digest, name
    return files


def test_bundle_holds_no_path_of_the_host(tmp_path, monkeypatch):
    run, home = make_pathy_run(tmp_path, monkeypatch)
    before = snapshot(run)
    bundle = pack(run, tmp_path / "b.tar.gz", collect=host)
    assert snapshot(run) == before
    files = checked(members(tmp_path / "b.tar.gz"))
    blob = b"\n".join(files.values()).decode()
    for needle in (str(tmp_path), str(home), f"/{USER}", USER, CLUSTER, "/srv/", MOVED, "/nfs/", "/lab/"):
        assert needle not in blob, needle

    manifest = json.loads(files["R1/manifest.json"])
    assert manifest["command_line"] == [
        "invoke",
        "benchmark",
        "--prompts",
        "~/data/my prompts.json",
        "--output=<run>",
        "--cache",
        "…/hf",
        "--draft",
        "tiny",
    ]
    assert [i["path"] for i in manifest["inputs"]] == ["~/data/my prompts.json", "<run>/inputs/extra.json"]
    assert [i["sha256"] for i in manifest["inputs"]] == ["ab" * 32, "cd" * 32]
    assert (
        manifest["config"]["prompts"]
        == json.loads(files["R1/config.json"])["prompts"]
        == "~/data/my prompts.json"
    )
    assert manifest["reason"] == "could not read …/shared.json: permission denied"
    assert manifest["notes"] == [
        "log at <run>/logs/benchmark.log",
        "decode tok/s stays within 2%",
        "see https://example.org/a/b",
    ]
    docker, local = manifest["steps"]
    assert docker["log"] == "<run>/logs/benchmark.log"
    # The containers' side is no host's: mount targets, container HOME, workdir and in-container argv are kept.
    assert docker["argv"] == [
        "docker",
        "run",
        "--volume",
        f"<run>:{RUN_MOUNT}:rw",
        "--volume",
        f"~/.cache/huggingface/hub:{CACHE_MOUNT}:ro",
        "--env",
        f"HF_HUB_CACHE={CACHE_MOUNT}",
        "--env",
        "HOME=/tmp/home",
        "--workdir",
        "/tmp",
        "localhost/draftscope-transformers:0.1.0",
        "python",
        "-m",
        "draftscope",
        "worker",
        "benchmark",
        "--run-dir",
        RUN_MOUNT,
    ]
    assert local["argv"] == [
        "~/venvs/ds/bin/python3",
        "-m",
        "draftscope",
        "worker",
        "benchmark",
        "--run-dir=<run>",
        "--cache=…/hub",
    ]
    assert json.loads(files["R1/worker.json"])["cache"] == "~/.cache/torch/kernels"
    assert json.loads(files["R1/summary.json"])["source"] == "<run>/records.jsonl"
    records = [json.loads(line) for line in files["R1/records.jsonl"].splitlines()]
    assert [r["extra"]["kernel_cache"] for r in records] == ["…/0", "…/1"]
    assert b"generated_token_ids" not in files["R1/records.jsonl"]

    paths = json.loads(files["R1/SHARE.json"])["paths"]
    expected = {
        "config.json": 1,
        "manifest.json": 14,
        "records.jsonl": 2,
        "summary.json": 1,
        "worker.json": 1,
    }
    assert paths["kept"] is False and paths["members"] == expected and paths["rewritten"] == 19
    assert bundle.paths == expected and any("19 of this host rewritten" in line for line in bundle.lines())


def test_keep_paths_packs_them_verbatim(tmp_path, monkeypatch):
    run, home = make_pathy_run(tmp_path, monkeypatch)
    bundle = pack(run, tmp_path / "b.tar.gz", keep_paths=True, collect=host)
    files = checked(members(tmp_path / "b.tar.gz"))
    for name in ("manifest.json", "summary.json", "worker.json"):
        assert files[f"R1/{name}"] == (run / name).read_bytes()
    blob = b"\n".join(files.values()).decode()
    assert str(home) in blob and f"{CLUSTER}/{USER}" in blob and str(run) in blob
    assert json.loads(files["R1/SHARE.json"])["paths"]["kept"] is True and bundle.paths is None
    assert any("--keep-paths" in line for line in bundle.lines())


def test_members_without_paths_keep_their_bytes_and_bundles_repeat(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    run = make_run(tmp_path)
    first, second = (members(pack(run, tmp_path / n, collect=host).output) for n in ("a.tar.gz", "b.tar.gz"))
    for name in ("manifest.json", "summary.json", "worker.json"):
        assert first[f"R1/{name}"] == (run / name).read_bytes()
    assert json.loads(first["R1/SHARE.json"])["paths"] | {"rule": None} == {
        "kept": False,
        "rewritten": 0,
        "members": {},
        "rule": None,
    }
    run2, _ = make_pathy_run(tmp_path / "again", monkeypatch)
    first, second = (members(pack(run2, tmp_path / n, collect=host).output) for n in ("c.tar.gz", "d.tar.gz"))
    assert {n: v for n, v in first.items() if "SHA" not in n} == {
        n: v for n, v in second.items() if "SHA" not in n
    }


@pytest.mark.parametrize(
    "value, expected",
    [
        ("/data/runs/exp 1/R7/inputs/p.json", "<run>/inputs/p.json"),  # the run directory, spaces and all
        ("/data/runs/exp 1/R7", "<run>"),
        ("/Users/Ann Lee/.cache/hf", "~/.cache/hf"),
        (
            "cannot open /Users/Ann Lee/x.json (denied); /opt/site/y.bin too",
            "cannot open ~/x.json (denied); …/y.bin too",
        ),
        ("--prompts=/mnt/share/team/prompts.jsonl", "--prompts=…/prompts.jsonl"),
        ("PATH=/usr/local/bin:/Users/Ann Lee/bin", "PATH=…/bin:~/bin"),
        ("/mnt/a/b/../c/", "…/c"),
        (f"/mnt/x/cache:{CACHE_MOUNT}:ro", f"…/cache:{CACHE_MOUNT}:ro"),
        (
            f"type=bind,source=/data/runs/exp 1/R7,target={RUN_MOUNT}",
            f"type=bind,source=<run>,target={RUN_MOUNT}",
        ),
        (
            f"type=bind,source=/mnt/x/cache,target={CACHE_MOUNT},readonly",
            f"type=bind,source=…/cache,target={CACHE_MOUNT},readonly",
        ),
        (f"{RUN_MOUNT}/inputs/prompts.json", f"{RUN_MOUNT}/inputs/prompts.json"),
        ("/draftscope/models/target", "/draftscope/models/target"),
        ("/tmp/home/.cache/vllm", "/tmp/home/.cache/vllm"),
        ("/tmp", "/tmp"),
        ("/", "/"),
        ("decode tok/s and/or 3/4 of it", "decode tok/s and/or 3/4 of it"),
        ("https://huggingface.co/org/model/tree/main", "https://huggingface.co/org/model/tree/main"),
        ("runs/my-run", "runs/my-run"),
        ("~/x/y", "~/x/y"),
        ("<run>/inputs/p.json", "<run>/inputs/p.json"),
        ("…/p.json", "…/p.json"),
    ],
)
def test_path_rewriting(value, expected):
    paths = HostPaths(["/data/runs/exp 1/R7"], "/Users/Ann Lee")
    assert paths.json({"argv": [value], "field": value}) == {"argv": [expected], "field": expected}
    assert paths.json(expected) == expected, "rewriting is idempotent"


def test_cli_keep_paths(tmp_path, monkeypatch):
    run, home = make_pathy_run(tmp_path, monkeypatch)
    from support import ROOT

    for args, bundle in (([], "b.tar.gz"), (["--keep-paths"], "k.tar.gz")):
        done = run_invoke(
            "--search-root",
            str(ROOT),
            "share",
            str(run),
            "--output",
            bundle,
            *args,
            cwd=tmp_path,
            env={"HOME": str(home)},
        )
        assert done.returncode == 0, done.stderr
    assert str(home) not in members(tmp_path / "b.tar.gz")["R1/manifest.json"].decode()
    assert str(home) in members(tmp_path / "k.tar.gz")["R1/manifest.json"].decode()


# --- a planted run directory (issue 18): its run id names no folder outside the bundle; no link is followed out --


@pytest.mark.parametrize("run_id", ["../escape", "/abs/escape", "a/b", "x\x00y", "ok\n", "a" * 200, "..", 7])
def test_a_run_id_that_would_escape_the_bundle_is_refused(tmp_path, run_id):
    run = make_run(tmp_path)
    doc = json.loads((run / "manifest.json").read_text())
    doc["run_id"] = run_id
    (run / "manifest.json").write_text(json.dumps(doc))
    out = tmp_path / "b.tar.gz"
    with pytest.raises(UserError, match=r"\$\.run_id: is not a run id"):
        pack(run, out, collect=host)
    assert not out.exists()


@pytest.mark.parametrize("name", ["manifest.json", "records.jsonl", "summary.json", "worker.json"])
def test_a_packed_file_linking_out_of_the_run_is_refused(tmp_path, name):
    run = make_run(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"run_id": "R1", "secret": CANARY}))
    (run / name).unlink()
    (run / name).symlink_to(secret)
    out = tmp_path / "b.tar.gz"
    with pytest.raises(UserError, match="link pointing out of the run directory"):
        pack(run, out, collect=host)
    assert not out.exists()


def test_links_and_pipes_among_the_other_files_are_left_out(tmp_path):
    run = make_run(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside-the-run-5521")
    (run / "logs" / "out.log").symlink_to(secret)
    (run / "logs" / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(run / "logs" / "pipe")
    out = tmp_path / "b.tar.gz"
    pack(run, out, include_text=True, collect=host)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert all(n.startswith("R1/") and ".." not in n.split("/") for n in names)
        assert not [n for n in names if "out.log" in n or "elsewhere" in n or "pipe" in n]
        packed = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
        assert b"outside-the-run-5521" not in packed


def test_a_runs_recorded_mount_source_counts_as_the_run(tmp_path):
    from draftscope.runtime.container import mount_spec

    old = "/old/place, with a comma/R1"
    manifest = {"steps": [{"argv": ["docker", "run", "--mount", mount_spec(old, RUN_MOUNT, False)]}]}
    paths = HostPaths.for_run(tmp_path / "R1", manifest, home="/nowhere")
    assert paths.path(f"{old}/logs/x.log") == "<run>/logs/x.log"


def test_a_hostile_record_line_is_left_out_and_a_hostile_member_is_packed_as_text(tmp_path):
    """Lines and members that break a plain json.loads (nesting past the interpreter's recursion limit, a number of
    10,000 digits) go through the reading boundary: the record is left out as damaged, the member's paths are
    rewritten as text; nothing raises."""
    run = make_run(tmp_path)
    deep = "[" * 100_000 + "]" * 100_000
    with (run / "records.jsonl").open("a") as fh:
        fh.write(deep + "\n" + '{"n": ' + "9" * 10_000 + "}\n")
    (run / "worker.json").write_text('{"facts": ' + deep + ', "at": "/opt/someone/x"}')
    bundle = pack(run, tmp_path / "b.tar.gz", collect=host)
    assert bundle.torn_lines == 2
    files = members(tmp_path / "b.tar.gz")
    assert b"/opt/someone" not in files["R1/worker.json"]
