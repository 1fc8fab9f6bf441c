"""The tiny preset's hidden-state extractor: Transformers on a CPU, writing exactly what speculators' vLLM path writes.

One `hs_<row>.safetensors` per row of the prepared dataset (`<row>` = the row's index in it), with `token_ids [T]`
(int64) and `hidden_states [T, n, H]`: for each requested index k, the output of decoder layer k-1 — the residual
stream after that layer, before the final norm — in the order given, the final layer last. That is vLLM's capture
(`hidden_states + residual` after each layer, the last one before `norm`); Transformers' own `hidden_states` tuple
applies the final norm to its last entry, so the values are taken with forward hooks on the decoder layers instead.

Resumable like speculators' client: a row whose file exists is skipped; each file is written to a temporary name
and renamed, so a killed run leaves only whole files. `--world-size N --rank I` (a task of a Slurm job array) takes
only block I of N of the rows, split as speculators' client splits them (`runner.block`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.schema import check
from draftscope.pipeline.stages.hsextract.runner import block


def file_for(output: Path, row: int) -> Path:
    return output / f"hs_{row}.safetensors"


def decoder_layers(model: Any) -> Sequence[Any]:
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UserError(
            "the model has no decoder layers at model.layers", fix="use a Qwen/Llama-style causal LM"
        )
    return layers


def extract(
    model: Any, rows: Iterable[tuple[int, Sequence[int]]], output: Path, layer_ids: Sequence[int], dtype: str
) -> dict[str, int]:
    """Write one file per row not already present; return counts (rows seen, files written, skipped)."""
    # lazy: torch and safetensors, in the train image only
    import torch
    from safetensors.torch import save_file

    layers = decoder_layers(model)
    if min(layer_ids) < 1 or max(layer_ids) > len(layers):
        raise UserError(
            f"hidden-state indices {list(layer_ids)} are outside 1..{len(layers)} for a {len(layers)}-layer model",
            field="--layer-ids",
        )
    torch_dtype = getattr(torch, dtype)
    output.mkdir(parents=True, exist_ok=True)
    captured: dict[int, Any] = {}

    def hook(index: int):
        def store(_module: Any, _inputs: Any, out: Any) -> None:
            captured[index] = out[0] if isinstance(out, tuple) else out

        return store

    handles = [layers[k - 1].register_forward_hook(hook(k)) for k in sorted(set(layer_ids))]
    counts = {"rows": 0, "written": 0, "skipped": 0}
    try:
        with torch.no_grad():
            for row, ids in rows:
                counts["rows"] += 1
                target = file_for(output, row)
                if target.exists():
                    counts["skipped"] += 1
                    continue
                captured.clear()
                token_ids = torch.tensor([list(ids)], dtype=torch.long)
                model(input_ids=token_ids)
                states = torch.stack([captured[k][0] for k in layer_ids], dim=1).to(torch_dtype).contiguous()
                partial = target.with_name(target.name + ".partial")
                save_file({"token_ids": token_ids[0].contiguous(), "hidden_states": states}, str(partial))
                os.replace(partial, target)
                counts["written"] += 1
    finally:
        for handle in handles:
            handle.remove()
    return counts


def prepared_rows(
    path: Path, world_size: int | None = None, rank: int | None = None
) -> Iterator[tuple[int, list[int]]]:
    """(row index, input_ids) of a speculators prepare-data folder (a `datasets.save_to_disk` dataset); with
    `world_size` and `rank`, only that rank's block."""
    # lazy: datasets, in the train image only
    try:
        from datasets import load_from_disk
    except ImportError as exc:
        raise MissingDependency(exc.name or "datasets", image="train") from None
    dataset = load_from_disk(str(path))
    if world_size is None:
        for index, row in enumerate(dataset):
            yield index, [int(t) for t in row["input_ids"]]
        return
    for index in block(len(dataset), world_size, rank or 0):
        yield index, [int(t) for t in dataset[index]["input_ids"]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--layer-ids", type=int, nargs="+", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--world-size", type=int, default=None, help="with --rank: only that block of the rows")
    p.add_argument("--rank", type=int, default=None)


def main(args: argparse.Namespace) -> dict[str, Any]:
    # lazy: torch and transformers, in the train image only
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise MissingDependency(exc.name or "torch", extra="local", image="train") from None
    model = AutoModelForCausalLM.from_pretrained(
        args.model, local_files_only=True, dtype=torch.float32
    ).eval()
    output = Path(args.output)
    world_size, rank = getattr(args, "world_size", None), getattr(args, "rank", None)
    if (world_size is None) != (rank is None):
        raise UserError("--world-size and --rank go together", field="--rank")
    if world_size is None:
        counts = extract(model, prepared_rows(Path(args.data)), output, args.layer_ids, args.dtype)
        files = len(list(output.glob("hs_*.safetensors")))
    else:  # a block of a shared folder: only this block's files are this run's
        rows = list(prepared_rows(Path(args.data), world_size, rank))
        counts = extract(model, rows, output, args.layer_ids, args.dtype)
        files = sum(1 for row, _ in rows if file_for(output, row).is_file())
    summary = {
        "schema_version": 1,
        "rows": counts["rows"],
        "files": files,
        "layer_ids": list(args.layer_ids),
        "hidden_size": int(model.config.hidden_size),
        "extractor": "transformers",
        "dtype": args.dtype,
    }
    if files < counts["rows"]:
        raise UserError(f"{counts['rows'] - files} row(s) have no hidden-state file", source=str(output))
    check(summary, "stage-hsextract", args.summary)
    Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(args.summary), summary)
    return {**counts, "files": files}
