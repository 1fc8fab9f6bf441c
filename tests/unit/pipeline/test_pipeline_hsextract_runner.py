"""The vLLM hidden-state stage's orchestration, run on a CPU with stand-ins for the two upstream programs: a
server with vLLM's `/health`, and clients that write their `--world-size/--rank` shard of `hs_<row>.safetensors`.
The runner starts the servers, runs the clients side by side, and then checks the files itself — a row without
its file, a wrong shape or a failed client fails the stage, whatever the exit codes said."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.schema import problems
from draftscope.pipeline.stages.hsextract import runner as H

from support import HEALTH_SERVER

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytestmark = pytest.mark.slow  # long: scheduled first (tests/conftest.py)

# rank, world size, rows, output, layers, hidden, skip-row: writes rows r with r % world == rank
CLIENT = """
import sys, torch
from safetensors.torch import save_file
rank, world, rows, out, layers, hidden, skip = (int(a) if a.lstrip("-").isdigit() else a for a in sys.argv[1:8])
for r in range(rank, rows, world):
    if r == skip:
        continue
    t = 3 + r
    save_file({"token_ids": torch.arange(t), "hidden_states": torch.zeros(t, layers, hidden, dtype=torch.bfloat16)},
              f"{out}/hs_{r}.safetensors")
"""
ROWS, LAYERS, HIDDEN = 6, 3, 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup(tmp_path: Path, *, skip: int = -1, hidden: int = HIDDEN, exit_code: int = 0) -> argparse.Namespace:
    out = tmp_path / "hidden_states"
    commands = []
    for rank in range(2):
        port = free_port()
        commands.append(
            {
                "name": f"server-{rank}",
                "argv": [sys.executable, "-c", HEALTH_SERVER, str(port)],
                "env": {},
                "gpus": [rank],
                "port": port,
            }
        )
    for rank in range(2):
        code = f"sys.exit({exit_code})\n" if rank == 1 and exit_code else ""
        commands.append(
            {
                "name": f"client-{rank}",
                "env": {},
                "gpus": [],
                "port": None,
                "argv": [
                    sys.executable,
                    "-c",
                    CLIENT + code,
                    str(rank),
                    "2",
                    str(ROWS),
                    str(out),
                    str(LAYERS),
                    str(hidden),
                    str(skip),
                ],
            }
        )
    stages = tmp_path / "stages"
    stages.mkdir(exist_ok=True)
    (stages / "hsextract.commands.json").write_text(json.dumps({"schema_version": 1, "commands": commands}))
    return argparse.Namespace(
        commands=str(stages / "hsextract.commands.json"),
        data="unused",
        output=str(out),
        summary=str(tmp_path / "hsextract" / "summary.json"),
        layer_ids=[2, 3, 4],
        hidden_size=HIDDEN,
        startup_timeout=30.0,
        logs=None,
    )


@pytest.fixture(autouse=True)
def six_rows(monkeypatch):
    monkeypatch.setattr(H, "dataset_rows", lambda path: ROWS)


def test_servers_then_sharded_clients_then_a_checked_summary(tmp_path):
    args = setup(tmp_path)
    counts = H.main(args)
    assert counts == {"rows": ROWS, "files": ROWS, "written": ROWS, "skipped": 0}
    summary = json.loads(Path(args.summary).read_text())
    assert problems(summary, "stage-hsextract") == []
    assert (
        summary["extractor"] == "vllm" and summary["dtype"] == "bfloat16" and summary["hidden_size"] == HIDDEN
    )
    assert (tmp_path / "logs" / "hsextract.server-1.log").is_file()
    assert (tmp_path / "logs" / "hsextract.client-1.log").is_file()


def test_a_row_without_its_file_fails_even_when_every_client_exited_0(tmp_path):
    with pytest.raises(UserError, match=r"1 row\(s\) have no hidden-state file \(rows 3\)"):
        H.main(setup(tmp_path, skip=3))
    assert not (tmp_path / "hsextract" / "summary.json").exists()


def test_a_failed_client_fails_the_stage_naming_it(tmp_path):
    with pytest.raises(
        UserError, match=r"1 of 2 client\(s\) failed \(client-1: exit 7\).*hsextract.client-1.log"
    ):
        H.main(setup(tmp_path, exit_code=7))


def test_files_of_the_wrong_hidden_size_are_refused(tmp_path):
    with pytest.raises(UserError, match="hidden_size: hidden size 8, expected 16"):
        H.main(setup(tmp_path, hidden=8))
