"""The progress layer (core/progress.py, bench/progress.py, pipeline/progress.py) against fake steps writing their
files over time: a plain line at least every few seconds, right final counts, half-written lines tolerated."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftscope.bench.progress import Progress, RecordsProbe
from draftscope.core.progress import TAIL_PREFIX, Reading, Watch, complete_lines, print_tail
from draftscope.pipeline.base import Artifact
from draftscope.pipeline.progress import StageProbe
from draftscope.pipeline.stages.train import STAGE as TRAIN


def record(i: int) -> str:
    return json.dumps(
        {
            "prompt_id": f"p{i}",
            "repeat": 0,
            "generated_tokens": 10,
            "request_seconds": 0.5,
            "request_tok_s": 20.0,
            "decode_tok_s": None,
            "acceptance_lengths": [2, 3],
        }
    )


def fake_worker(path: Path, n: int, silence: float, gap: float) -> None:
    """Silent first (loading), then `n` records, each written in two halves with a pause between them."""
    (path.parent / "worker.json").write_text(json.dumps({"phase": "loading"}))
    time.sleep(silence)
    with path.open("a", encoding="utf-8") as out:
        for i in range(n):
            line = record(i) + "\n"
            out.write(line[:15])
            out.flush()
            time.sleep(gap)
            out.write(line[15:])
            out.flush()
            time.sleep(gap)


class Said:
    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def __call__(self, text: str) -> None:
        self.lines.append((time.monotonic(), text))


def test_plain_lines_keep_coming_and_the_final_count_is_right(tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    said = Said()
    progress = Progress(records, 6, said, interval=0.02, every=0.2, tty=False)
    worker = threading.Thread(target=fake_worker, args=(records, 6, 0.8, 0.03))
    started = time.monotonic()
    progress.start()
    worker.start()
    worker.join()
    progress.stop()
    times = [started] + [t for t, _ in said.lines]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 2 * 0.2, gaps  # a line at least every `every` seconds (+ one poll, with slack)
    texts = [text for _, text in said.lines]
    assert any("0/6 requests" in t and "loading the model" in t for t in texts)  # the silent phase is named
    assert texts[-1].startswith("benchmark: 6/6 requests, 20.0 tok/s")
    assert "p5 repeat 0: 10 tokens, 20.0 tok/s, 2.50 tokens/step" in texts[-1]
    assert progress.probe.done == 6  # no half-written line counted twice or as a record
    assert sum("6/6" in t for t in texts) == 1  # the end is said once
    for i in range(6):  # a line for each request, naming it
        assert sum(t.startswith(f"benchmark: {i + 1}/6 requests") and f"p{i} " in t for t in texts) == 1


def test_requests_landing_within_one_poll_get_a_line_each(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    said: list[str] = []
    watch = Watch(
        "benchmark", RecordsProbe(path, 4), say=said.append, unit="requests", interval=60, tty=False
    )
    watch.start()  # the first reading: nothing yet
    path.write_text("".join(record(i) + "\n" for i in range(3)))
    watch.stop()  # the last reading sees three at once
    assert said[1] == "benchmark: 1/4 requests — p0 repeat 0: 10 tokens, 20.0 tok/s, 2.50 tokens/step"
    assert said[2].startswith("benchmark: 2/4 requests — p1 ")
    assert said[3].startswith("benchmark: 3/4 requests, 20.0 tok/s, ")
    assert said[3].endswith("— p2 repeat 0: 10 tokens, 20.0 tok/s, 2.50 tokens/step")
    assert len(said) == 4


def test_half_written_lines_wait_for_their_end(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(record(0) + "\n" + record(1)[:20])
    lines, offset = complete_lines(path)
    assert len(lines) == 1 and offset == len(record(0)) + 1
    now = [10.0]
    probe = RecordsProbe(path, 3, clock=lambda: now[0])
    assert probe().done == 1  # the first request began 0.5 s before it was seen
    with path.open("a") as out:
        out.write(record(1)[20:] + "\nnot json\n")
    now[0] = 12.5
    reading = probe()
    assert reading.done == 2 and reading.eta == pytest.approx(1.5)  # a bad line is skipped, never fatal
    with path.open("a") as out:
        out.write(record(2).replace('"decode_tok_s": null', '"decode_tok_s": 30.0') + "\n")
    assert probe().note == "p2 repeat 0: 10 tokens, 20.0 tok/s, decode 30.0 tok/s, 2.50 tokens/step"
    assert complete_lines(tmp_path / "absent.jsonl") == ([], 0)


def test_a_failing_probe_or_printer_never_stops_the_watch() -> None:
    calls = {"n": 0}

    def probe() -> Reading:
        calls["n"] += 1
        if calls["n"] % 2:
            raise ValueError("mid-rename")
        return Reading(calls["n"], 10)

    def say(text: str) -> None:
        raise OSError("stdout closed")

    watch = Watch("stage", probe, say=say, interval=0.01, tty=False).start()
    time.sleep(0.1)
    watch.stop()
    watch.stop()  # twice is harmless
    assert calls["n"] > 3 and watch.last.done is not None


def test_the_terminal_bar_runs_and_stops(capsys: pytest.CaptureFixture[str]) -> None:
    watch = Watch("stage", lambda: Reading(3, 4, "1.0 tok/s", "note"), tty=True, interval=0.01).start()
    time.sleep(0.05)
    watch.stop()
    assert watch.last == Reading(3, 4, "1.0 tok/s", "note")
    assert "stage" in capsys.readouterr().out


def test_eta_and_line_wording() -> None:
    now = [100.0]
    watch = Watch("regen", lambda: Reading(), unit="rows", tty=False, clock=lambda: now[0])
    now[0] = 130.0
    assert watch.line(Reading(10, 40, note="x")) == "regen: 10/40 rows, 30 s elapsed, ETA 1:30 — x"
    assert watch.line(Reading(note="step 3")) == "regen: 30 s elapsed — step 3"
    assert Watch.eta(Reading(4, 4), 10.0) is None and Watch.eta(Reading(1, 4, eta=2.0), 10.0) == 2.0


def test_failure_tail_is_printed_as_lines(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    said: list[str] = []
    print_tail(log, said.append)
    assert said[0] == f"last 20 lines of {log}:"
    assert said[1:] == [f"{TAIL_PREFIX}line {i}" for i in range(10, 30)]
    print_tail(tmp_path / "absent.log", said.append)
    assert len(said) == 21


def test_stage_probe_counts_rows_of_the_input(tmp_path: Path) -> None:
    chat = tmp_path / "chat.jsonl"
    chat.write_text("{}\n" * 8)
    rows, errors, log = tmp_path / "rows.jsonl", tmp_path / "errors.jsonl", tmp_path / "regen.log"
    sp = SimpleNamespace(
        inputs=[Artifact("chat", chat)],
        outputs=[
            Artifact("rows", rows),
            Artifact("errors", errors),
            Artifact("summary", tmp_path / "s.json"),
        ],
    )
    rows.write_text("{}\n" * 8)  # a previous run's
    old = time.time() - 60
    os.utime(rows, (old, old))
    probe = StageProbe(sp, log)  # type: ignore[arg-type]
    assert probe() == Reading(0, 8)
    rows.write_text("{}\n" * 5 + "{")
    errors.write_text("{}\n")
    log.write_text("server up\n\nrow 6 done\n")
    assert probe() == Reading(6, 8, note="row 6 done")
    other = StageProbe(SimpleNamespace(inputs=[], outputs=[Artifact("dataset", tmp_path)]), log)  # type: ignore[arg-type]
    assert other() == Reading(note="row 6 done") and probe.unit == "rows"
    # A stage with a probe of its own (train: tests/unit/pipeline/test_train_progress.py) reads through it.
    train = StageProbe(SimpleNamespace(stage=TRAIN, inputs=[], outputs=[]), log)  # type: ignore[arg-type]
    assert train.unit == "steps"
    with log.open("a") as fh:
        fh.write("INFO     Training epoch 2/20 started\n   train/loss=3.1,\n   global_step=12\n")
    assert train() == Reading(13, note="epoch 2/20, loss 3.100, ETA once epoch 2 ends")
