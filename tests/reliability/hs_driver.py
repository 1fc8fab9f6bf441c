"""Fault driver for the hidden-state extractor, run as its own process by test_faults_hsextract.py.

`python hs_driver.py OUT SEED FAULTS` builds a small random Qwen3 and synthetic token rows, then kills
`transformers_extractor.extract` again and again while it writes `OUT/hs/hs_<row>.safetensors`: SIGKILL or SIGTERM
after a seeded number of new files or a seeded moment, and SIGKILL between a file's write and its rename. Each
attempt is a fork of this process (torch is imported once; the child runs the kit's real extractor and is killed
for real). After each kill every whole file must load with the right shapes and every file seen before must be
unchanged; finally a clean resume must produce exactly the files of an uninterrupted run. Prints a JSON report.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)  # before any op: no thread pool exists when the process forks

from safetensors import safe_open  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from draftscope.pipeline.stages.hsextract import transformers_extractor as hx  # noqa: E402

ROWS = 64
LAYERS = [2, 3, 4]  # speculators' hidden-state indices: two auxiliary layers, then the final one (4 layers)
HIDDEN = 64


def model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    return Qwen3ForCausalLM(config).eval()


def rows(seed: int) -> list[tuple[int, list[int]]]:
    rng = random.Random(f"{seed}:hs-rows")
    return [(i, [rng.randrange(512) for _ in range(rng.randint(8, 96))]) for i in range(ROWS)]


def final_files(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("hs_*.safetensors"))
    }


def broken(folder: Path, data: dict[int, list[int]]) -> list[str]:
    """Files presented as final that do not load or have the wrong contents' shape."""
    bad = []
    for path in sorted(folder.glob("hs_*.safetensors")):
        row = int(path.stem.removeprefix("hs_"))
        try:
            with safe_open(str(path), framework="pt") as f:
                ids, states = f.get_tensor("token_ids"), f.get_tensor("hidden_states")
            ok = ids.tolist() == data[row] and tuple(states.shape) == (len(data[row]), len(LAYERS), HIDDEN)
        except Exception:
            ok = False
        if not ok:
            bad.append(path.name)
    return bad


def running(pid: int) -> bool:
    """Not yet exited (without reaping it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def attempt(m, data, out: Path, kill_at_rename: int | None = None) -> int:
    pid = os.fork()
    if pid == 0:  # the child: the kit's extractor, for real
        code = 0
        try:
            if kill_at_rename is not None:
                real, calls = os.replace, [0]

                def replace(src, dst):
                    calls[0] += 1
                    if calls[0] == kill_at_rename:
                        os.kill(os.getpid(), signal.SIGKILL)  # written and flushed, not yet renamed
                    return real(src, dst)

                os.replace = replace
            hx.extract(m, data, out, LAYERS, "float32")
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def main() -> None:
    out, seed, faults = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(f"{seed}:hsextract")
    m = model()
    data = rows(seed)
    by_row = dict(data)
    target = out / "hs"
    report = []
    for _ in range(faults):
        mode = rng.choice(["files", "files", "time", "rename"])
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
        before = final_files(target) if target.is_dir() else {}
        if mode == "rename":
            k = rng.randint(1, 3)
            what = f"SIGKILL between write and rename of new file {k}"
            pid = attempt(m, data, target, kill_at_rename=k)
        else:
            pid = attempt(m, data, target)
            if mode == "files":
                k = rng.randint(0, 3)
                what = f"{signal.Signals(sig).name} after {k} new files"
                deadline = time.monotonic() + 60
                while len(final_files(target) if target.is_dir() else {}) < len(before) + k:
                    if time.monotonic() > deadline or not running(pid):
                        break
                    time.sleep(0.001)
            else:
                delay = rng.uniform(0.0, 0.08)
                what = f"{signal.Signals(sig).name} at +{delay * 1000:.0f} ms"
                time.sleep(delay)
            os.kill(pid, sig)  # a child that already ended is a zombie until reaped: the kill cannot fail
        _, status = os.waitpid(pid, 0)
        landed = os.WIFSIGNALED(status)
        after = final_files(target)
        lost = sum(1 for name, sha in before.items() if after.get(name) != sha)
        report.append(
            {
                "what": what,
                "landed": landed,
                "lost": lost,
                "broken": broken(target, by_row),
                "files": len(after),
                "partials": len(list(target.glob("*.partial"))),
            }
        )
    # The clean resume, then an uninterrupted reference run: the same files, bit for bit.
    seen = final_files(target)
    counts = hx.extract(m, data, target, LAYERS, "float32")
    reference = out / "reference"
    hx.extract(m, data, reference, LAYERS, "float32")
    resumed, expected = final_files(target), final_files(reference)
    final = {
        "rows": ROWS,
        "files": len(resumed),
        "skipped": counts["skipped"],
        "written": counts["written"],
        "lost": sum(1 for name, sha in seen.items() if resumed.get(name) != sha),
        "differ": sorted(n for n in expected if resumed.get(n) != expected[n]),
        "broken": broken(target, by_row),
    }
    print(json.dumps({"faults": report, "final": final}))


if __name__ == "__main__":
    main()
