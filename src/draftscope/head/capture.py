"""Captured verification calls: what a benchmark run with `--capture-head N` leaves for `invoke head-study`.

`<run>/head/capture.safetensors` holds, per call i, `hidden.i` (the step's hidden rows [n, D] in the model's
dtype), `draft.i` (the n−1 draft tokens) and `dense.i` (the dense head's token per row); `<run>/head/capture.json`
lists the calls with their dense outcome (accepted proposals, correction or bonus token). safetensors, not pickle:
a reviewer can open a pulled run without running its code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_json

FOLDER = "head"
TENSORS = "capture.safetensors"
INDEX = "capture.json"


def write_capture(run_dir: Path | str, capture: Any, dtype: torch.dtype) -> Path:
    # lazy: safetensors, only when a capture is written
    from safetensors.torch import save_file

    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    calls = []
    for i, call in enumerate(capture.calls):
        tensors[f"hidden.{i}"] = call["hidden"].contiguous()
        tensors[f"draft.{i}"] = call["draft"].to(torch.int64).contiguous()
        tensors[f"dense.{i}"] = call["dense_tokens"].to(torch.int64).contiguous()
        calls.append(
            {
                "index": i,
                "rows": int(call["hidden"].shape[0]),
                "accepted": int(call["accepted"]),
                "next_token": int(call["next_token"]),
            }
        )
    partial = folder / (TENSORS + ".partial")
    save_file(tensors, str(partial))
    partial.replace(folder / TENSORS)
    hidden_size = int(capture.calls[0]["hidden"].shape[1]) if capture.calls else 0
    atomic_write_json(
        folder / INDEX,
        {
            "schema_version": 1,
            "dtype": str(dtype).removeprefix("torch."),
            "hidden_size": hidden_size,
            "calls": calls,
        },
    )
    return folder


def read_capture(run_dir: Path | str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(index, calls with their tensors) of a run's capture."""
    # lazy: safetensors, only when a capture is read
    from safetensors.torch import load_file

    folder = Path(run_dir) / FOLDER
    if not (folder / INDEX).is_file() or not (folder / TENSORS).is_file():
        raise UserError(
            "the run has no captured head calls",
            source=str(run_dir),
            fix="run the benchmark with --capture-head N (Transformers backend with a draft)",
        )
    index = read_json(folder / INDEX, expect=dict)
    tensors = load_file(str(folder / TENSORS))
    calls = []
    for entry in index["calls"]:
        i = entry["index"]
        calls.append(
            {
                **entry,
                "hidden": tensors[f"hidden.{i}"],
                "draft": tensors[f"draft.{i}"],
                "dense_tokens": tensors[f"dense.{i}"],
            }
        )
    return index, calls
