import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, iter_jsonl, read_json
from draftscope.core.rundir import RunDir

CONFIG = {"schema_version": 1, "name": "t", "backend": "transformers", "model_preset": "tiny"}


def make_run(path, **kw):
    return RunDir.create(path, kind="benchmark", config=CONFIG, argv=["test"], **kw)


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_create_writes_a_valid_manifest(tmp_path):
    run = make_run(tmp_path / "r1")
    m = run.manifest()
    assert m["status"] == "created" and m["run_id"] == "r1" and m["command_line"] == ["test"]
    assert m["kit"]["version"]
    assert (tmp_path / "r1" / "logs").is_dir()


def test_existing_directory_is_refused_and_left_byte_identical(tmp_path):
    run = make_run(tmp_path / "r1")
    with run.records() as rec:
        rec.append({"a": 1})
    (tmp_path / "r1" / "extra.txt").write_bytes(b"keep me\x00")
    before = snapshot(tmp_path / "r1")
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "r1").rglob("*")}
    with pytest.raises(UserError) as err:
        make_run(tmp_path / "r1")
    assert "already exists" in str(err.value) and "\n" not in str(err.value)
    assert snapshot(tmp_path / "r1") == before
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "r1").rglob("*")} == mtimes


@pytest.mark.parametrize("kind", ["empty-dir", "file", "symlink"])
def test_any_existing_path_is_refused(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "empty-dir":
        target.mkdir()
    elif kind == "file":
        target.write_text("data")
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match="already exists"):
        make_run(target)
    if kind == "symlink":
        assert list((tmp_path / "elsewhere").iterdir()) == []


def test_concurrent_creators_exactly_one_wins(tmp_path):
    def attempt(_):
        try:
            make_run(tmp_path / "race")
            return "ok"
        except UserError:
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert results.count("ok") == 1 and results.count("refused") == 7


def test_invalid_config_is_refused_before_creation(tmp_path):
    with pytest.raises(UserError, match=r"config: \$.backend"):
        RunDir.create(tmp_path / "r", kind="benchmark", config={**CONFIG, "backend": "Not A Name"})
    assert not (tmp_path / "r").exists()


def test_missing_input_fails_before_anything_is_created(tmp_path):
    from draftscope.core.rundir import InputFile

    with pytest.raises(UserError, match="input file not found"):
        make_run(tmp_path / "r", inputs=[InputFile("prompts", tmp_path / "nope.json")])
    assert not (tmp_path / "r").exists()


def test_inputs_are_hashed_and_copied(tmp_path):
    from draftscope.core.rundir import InputFile

    src = tmp_path / "p.json"
    src.write_text('{"a": 1}')
    run = make_run(tmp_path / "r", inputs=[InputFile("prompts", src)])
    (entry,) = run.manifest()["inputs"]
    assert entry["sha256"] == hashlib.sha256(b'{"a": 1}').hexdigest() and entry["bytes"] == 8
    assert (tmp_path / "r" / "inputs" / "p.json").read_text() == '{"a": 1}'


def test_status_lifecycle(tmp_path):
    run = make_run(tmp_path / "r")
    m = run.set_status("running")
    assert m["started_at"] and m["finished_at"] is None
    m = run.set_status("timed_out", "max-seconds 5 reached")
    assert m["reason"] == "max-seconds 5 reached" and m["finished_at"]
    with pytest.raises(UserError, match="cannot become 'running'"):
        run.set_status("running")
    with pytest.raises(ValueError, match="needs a reason"):
        make_run(tmp_path / "r2").set_status("failed")


def test_complete_requires_valid_artifacts(tmp_path):
    run = make_run(tmp_path / "r")
    run.set_status("running")
    with pytest.raises(UserError, match=r"summary.json.*missing"):
        run.complete()
    assert run.manifest()["status"] == "running"


def test_atomic_write_leaves_no_temp_and_replaces_whole(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})
    atomic_write_json(path, {"v": 2})
    assert read_json(path) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_killed_appender_leaves_only_whole_lines(tmp_path):
    """SIGKILL a writer mid-stream: every line that exists parses, none is torn."""
    path = tmp_path / "records.jsonl"
    code = textwrap.dedent(f"""
        import sys
        from draftscope.core.jsonio import JsonlAppender
        with JsonlAppender({str(path)!r}) as out:
            i = 0
            while True:
                out.append({{"i": i, "pad": "x" * 2000}})
                i += 1
                if i == 50:
                    print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rows = [obj for _, obj in iter_jsonl(path)]
    assert len(rows) >= 50
    assert [r["i"] for r in rows] == list(range(len(rows)))
    assert path.read_bytes().endswith(b"\n")


def test_torn_line_is_reported(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2')
    with pytest.raises(UserError, match="line 2 is incomplete"):
        list(iter_jsonl(path))
