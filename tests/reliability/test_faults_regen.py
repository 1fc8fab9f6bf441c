"""Faults injected into a real regen stage (`invoke pipeline --preset tiny --runtime local --stage regen`: the tiny
target behind the kit's loopback server, the sharded client), one after another on the same workdir: the stage
(with its server) or the supervisor killed with SIGKILL, SIGTERM or SIGINT at seeded row counts, and once during
start-up. After each fault: no torn line, every row already written still there byte for byte, no row twice, the
server gone, and the stage record naming what happened; the last rerun accounts for every row (ok + errors ==
input) with nothing lost or duplicated."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from draftscope.core.jsonio import read_json
from draftscope.core.schema import problems

from faultlib import (
    alive,
    complete_lines,
    duplicates,
    free_port,
    kill_group,
    lost_from,
    pipeline_argv,
    port_is_free,
    read_lines,
    signal_name,
    start,
    wait_for_child,
    wait_for_lines,
    wait_until,
)

pytest.importorskip("transformers")

pytestmark = pytest.mark.reliability

ROWS = 48


def regen_argv(workdir: Path, port: int) -> list[str]:
    return pipeline_argv(
        "--preset",
        "tiny",
        "--runtime",
        "local",
        "--stage",
        "regen",
        "--workdir",
        str(workdir),
        "--opts",
        f"regen.base_port={port}",
        "--opts",
        "regen.concurrency=2",
        "--opts",
        f"data.max_rows={ROWS}",
        "--opts",
        "regen.max_tokens=24",
    )


def draw_faults(seed: int) -> list[tuple[str, int, int | None, float | None]]:
    """(target, signal, at rows, at seconds) in the order they are injected (row counts increase)."""
    rng = random.Random(f"{seed}:regen")
    modes = [
        ("stage", signal.SIGKILL),
        ("supervisor", signal.SIGTERM),
        ("stage", signal.SIGTERM),
        ("supervisor", signal.SIGINT),
        ("all", signal.SIGKILL),
    ]
    rng.shuffle(modes)
    points = sorted(rng.sample(range(1, ROWS - 8), len(modes)))
    early = ("stage", signal.SIGKILL, None, rng.uniform(0.2, 2.5))  # during the server's start-up
    return [early, *((t, s, k, None) for (t, s), k in zip(modes, points, strict=True))]


def row_ids(lines: list[bytes]) -> list[str]:
    return [json.loads(line)["id"] for line in lines]


def test_regen_faults_then_rerun_accounts_for_every_row(tmp_path, figures, seed):
    workdir, port = tmp_path / "w", free_port()
    rows = workdir / "regen" / "rows.jsonl"
    seen: list[bytes] = []  # every row line observed before any fault
    for number, (target, sig, at_rows, at_seconds) in enumerate(draw_faults(seed)):
        when = f"after {at_rows} rows" if at_rows is not None else f"at +{at_seconds:.2f} s"
        with figures.fault("regen", f"{target} {signal_name(sig)} {when}") as fault:
            proc = start(regen_argv(workdir, port), log=tmp_path / f"attempt{number}.log")
            try:
                stage = wait_for_child(proc, "draftscope.pipeline regen")
                if at_rows is not None:
                    wait_for_lines(rows, at_rows, proc)
                else:
                    time.sleep(at_seconds or 0.0)
                before = complete_lines(rows)
                seen += [line for line in before if line not in seen]
                if target == "stage":
                    kill_group(stage, sig)  # the client and its server (one process group)
                elif target == "supervisor":
                    proc.send_signal(sig)
                else:
                    proc.kill()
                    kill_group(stage, signal.SIGKILL)
                proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            after, torn = read_lines(rows)
            fault.tear(torn)
            fault.lose(lost_from(before, after))
            assert proc.returncode != 0
            assert duplicates(row_ids(after)) == 0, "a row was written twice"
            wait_until(lambda: port_is_free(port) and not alive(stage), 30, "the server and stage to end")  # noqa: B023
            record = workdir / "stages" / "regen.json"
            if target in ("stage", "supervisor"):
                facts = read_json(record)
                assert problems(facts, "stage-record") == []
                if target == "stage":
                    # SIGTERM: the stage stops its servers first (KeyboardInterrupt), then ends by a signal too.
                    assert facts["status"] == "failed" and "(killed by SIG" in facts["reason"], facts[
                        "reason"
                    ]
                else:
                    phrase = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
                    assert facts["status"] == "interrupted" and phrase in facts["reason"], facts["reason"]
            assert torn == 0 and fault.lost == 0

    with figures.rerun("regen", "rerun after the faults: every row accounted for") as fault:
        before = complete_lines(rows)
        proc = start(regen_argv(workdir, port), log=tmp_path / "final.log")
        assert proc.wait(timeout=300) == 0, (tmp_path / "final.log").read_text()[-3000:]
        after, torn = read_lines(rows)
        fault.tear(torn)
        fault.lose(lost_from(seen, after))
        summary = read_json(workdir / "regen" / "summary.json")
        assert (
            summary["input"] == ROWS
            and summary["ok"] + summary["errors"] == ROWS
            and summary["missing"] == []
        )
        ids = row_ids(after)
        assert duplicates(ids) == 0 and summary["ok"] == len(ids)
        record = read_json(workdir / "stages" / "regen.json")
        assert record["status"] == "completed" and record["counts"]["resumed"] == len(before)
        assert port_is_free(port)
