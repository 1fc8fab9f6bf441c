"""The regen client: row checks, retries on transient statuses, errors for the rest, resume after a torn write, and
the final accounting (`ok + errors == input`, no row twice), against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.pipeline.stages.regen import client as R

SAMPLING = R.Sampling("target", 8, 0.0, 0)


class FlakyServer:
    """An OpenAI-style chat endpoint: `transient` failures (status `code`) before the first success of each row;
    rows whose prompt contains "bad" always get a 400; records every request."""

    def __init__(self, transient: int = 0, code: int = 503) -> None:
        self.transient, self.code = transient, code
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                with outer.lock:
                    outer.seen[prompt] += 1
                    count = outer.seen[prompt]
                if "bad" in prompt:
                    status, payload = 400, {"error": {"message": "bad request"}}
                elif count <= outer.transient:
                    status, payload = outer.code, {"error": {"message": "busy"}}
                else:
                    status, payload = (
                        200,
                        {
                            "choices": [
                                {
                                    "message": {"role": "assistant", "content": f"re: {prompt}"},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {"completion_tokens": 3},
                        },
                    )
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(R, "BACKOFF_BASE_S", 0.01)


def write_rows(path: Path, prompts: list[str], assistant: bool = True) -> list[R.Row]:
    lines = []
    for i, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt}]
        if assistant:
            messages.append({"role": "assistant", "content": "old answer"})
        lines.append(json.dumps({"id": f"r{i}", "messages": messages, "topic": "t"}))
    path.write_text("\n".join(lines) + "\n")
    return R.read_rows(path)


def test_rows_are_checked_with_the_line_and_field(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(
        '{"id": 1, "messages": [{"role": "user", "content": "a"}]}\n'
        '{"id": 1, "messages": [{"role": "user", "content": "b"}]}\n'
    )
    with pytest.raises(UserError, match=r"chat.jsonl:2.*duplicate row id '1'"):
        R.read_rows(path)
    path.write_text('{"id": "a", "messages": [{"role": "user"}]}\n')
    with pytest.raises(UserError, match="messages must be a list"):
        R.read_rows(path)
    path.write_text('{"id": "a", "messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(UserError, match="nothing to answer"):
        R.read_rows(path)
    path.write_text('{"messages": []}\n')
    with pytest.raises(UserError, match="needs an 'id'"):
        R.read_rows(path)


def test_the_prompt_drops_only_a_final_assistant_turn(tmp_path):
    (row,) = write_rows(tmp_path / "c.jsonl", ["q"], assistant=True)
    assert row.prompt() == [{"role": "user", "content": "q"}]
    (row,) = write_rows(tmp_path / "d.jsonl", ["q"], assistant=False)
    assert row.prompt() == [{"role": "user", "content": "q"}]


def test_transient_statuses_are_retried_and_rows_shard_over_instances(tmp_path, fast_backoff):
    servers = [FlakyServer(transient=2, code=code) for code in (503, 429)]
    try:
        rows = write_rows(tmp_path / "chat.jsonl", [f"q{i}" for i in range(10)])
        tally = R.regenerate(
            rows,
            [s.url for s in servers],
            SAMPLING,
            tmp_path / "out",
            concurrency=3,
            max_retries=3,
            timeout=10,
            say=lambda _: None,
        )
    finally:
        for s in servers:
            s.close()
    assert (tally.ok, tally.errors, tally.retries) == (10, 0, 20)
    assert (
        sum(servers[0].seen.values()) == 15 and sum(servers[1].seen.values()) == 15
    )  # 5 rows × 3 tries each
    ok, errors, missing = R.account(rows, tmp_path / "out")
    assert len(ok) == 10 and not errors and not missing
    out = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in out}
    assert by_id["r3"]["messages"] == [
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "re: q3"},
    ]
    assert by_id["r3"]["topic"] == "t" and by_id["r3"]["regen"]["instance"] == 1
    assert by_id["r4"]["regen"] == {
        "instance": 0,
        "finish_reason": "stop",
        "completion_tokens": 3,
        "attempts": 3,
    }


def test_a_client_error_is_not_retried_and_exhausted_retries_become_errors(tmp_path, fast_backoff):
    server = FlakyServer(transient=100)
    try:
        rows = write_rows(tmp_path / "chat.jsonl", ["bad one", "busy one"])
        tally = R.regenerate(
            rows,
            [server.url],
            SAMPLING,
            tmp_path / "out",
            concurrency=2,
            max_retries=2,
            timeout=10,
            say=lambda _: None,
        )
    finally:
        server.close()
    assert server.seen["bad one"] == 1 and server.seen["busy one"] == 3
    assert (tally.ok, tally.errors) == (0, 2)
    errors = {
        e["id"]: e for e in map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())
    }
    assert errors["r0"]["status"] == 400 and errors["r0"]["attempts"] == 1
    assert errors["r1"]["status"] == 503 and errors["r1"]["attempts"] == 3
    ok, failed, missing = R.account(rows, tmp_path / "out")
    assert not ok and failed == {"r0", "r1"} and not missing


def test_no_server_at_all_is_a_retried_connection_error(tmp_path, fast_backoff):
    rows = write_rows(tmp_path / "chat.jsonl", ["q"])
    tally = R.regenerate(
        rows,
        ["http://127.0.0.1:9"],
        SAMPLING,
        tmp_path / "out",
        concurrency=1,
        max_retries=1,
        timeout=2,
        say=lambda _: None,
    )
    (error,) = map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())
    assert tally.errors == 1 and error["status"] is None and error["attempts"] == 2


def test_resume_cuts_a_torn_line_skips_done_rows_and_retries_errors(tmp_path, fast_backoff):
    out = tmp_path / "out"
    out.mkdir()
    rows = write_rows(tmp_path / "chat.jsonl", [f"q{i}" for i in range(5)])
    done = {"id": "r0", "messages": [], "regen": {}}
    (out / "rows.jsonl").write_text(json.dumps(done) + "\n" + '{"id": "r1", "mess')  # killed mid-write
    (out / "errors.jsonl").write_text(json.dumps({"id": "r2", "error": "earlier"}) + "\n")
    assert R.done_ids(out / "rows.jsonl", {r.id for r in rows}) == {"r0"}
    assert (out / "rows.jsonl").read_text() == json.dumps(done) + "\n"
    kept = R.rotate_errors(out / "errors.jsonl")
    assert kept is not None and kept.name == "errors.attempt-1.jsonl" and not (out / "errors.jsonl").exists()
    server = FlakyServer()
    try:
        pending = [r for r in rows if r.id != "r0"]
        R.regenerate(
            pending, [server.url], SAMPLING, out, concurrency=2, max_retries=0, timeout=10, say=lambda _: None
        )
    finally:
        server.close()
    assert "q0" not in server.seen and server.seen["q2"] == 1
    ids = [json.loads(line)["id"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["r0", "r1", "r2", "r3", "r4"]
    ok, errors, missing = R.account(rows, out)
    assert len(ok) == 5 and not errors and not missing


def test_a_complete_last_record_without_newline_is_kept(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}')
    assert R.repair_tail(path) == 0
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_accounting_refuses_duplicates_and_rows_from_another_input(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rows = write_rows(tmp_path / "chat.jsonl", ["q0", "q1"])
    (out / "rows.jsonl").write_text('{"id": "r0"}\n{"id": "r0"}\n')
    with pytest.raises(UserError, match="'r0' is in the output twice"):
        R.account(rows, out)
    (out / "rows.jsonl").write_text('{"id": "zz"}\n')
    with pytest.raises(UserError, match="not in the input"):
        R.account(rows, out)
    (out / "rows.jsonl").write_text('{"id": "r0"}\n')
    (out / "errors.jsonl").write_text('{"id": "r0"}\n')
    with pytest.raises(UserError, match="accounted for twice"):
        R.account(rows, out)
    (out / "errors.jsonl").unlink()
    assert R.account(rows, out) == ({"r0"}, set(), ["r1"])
