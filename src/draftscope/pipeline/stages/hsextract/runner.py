"""The hsextract stage's in-container part for real presets: vLLM servers, speculators clients, a checked summary.

The commands file lists, per instance, a server (`vllm serve` with the hidden-state extraction method and its
connector) and a client (`speculators generate-offline-data --world-size N --rank i`). This starts the
servers, waits for vLLM's `/health`, runs the clients side by side (a server dying fails the stage at once), and
then checks the output folder itself rather than trusting exit codes: every row of the prepared dataset has its
`hs_<row>.safetensors`, and a sample of files has the captured layer count and the target's hidden size.

The rows checked are those the clients cover (`--world-size`/`--rank`, speculators' contiguous split): all of them in
a run of the whole stage; one block in a task of a Slurm job array, whose check job (`check_main`,
`hsextract-check`) then checks the whole output and writes the stage's summary.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftscope.core.errors import MissingDependency, UserError
from draftscope.core.jsonio import atomic_write_json
from draftscope.core.reading import read_json
from draftscope.core.schema import check
from draftscope.pipeline.servers import clients_of, load_commands, run_clients, servers_of, serving
from draftscope.pipeline.stages.hsextract.vllm_args import captured_layers, final_layer_problem

SAMPLED_FILES = 8
SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--commands", required=True)
    p.add_argument("--data", required=True, help="the prepared dataset (speculators prepare-data output)")
    p.add_argument("--output", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--layer-ids", type=int, nargs="+", required=True)
    p.add_argument("--hidden-size", type=int, default=None, help="checked against the files when given")
    p.add_argument("--startup-timeout", type=float, default=1800.0)
    p.add_argument("--logs", default=None)


def block(total: int, world_size: int, rank: int) -> range:
    """The rows of `rank` among `world_size`: speculators' `get_indices_to_process` split (contiguous blocks, the
    first `total % world_size` one row longer). The ranks of a world partition the rows."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise UserError(
            f"rank {rank} is outside a world of {world_size}", field="--rank", fix="0 <= rank < world size"
        )
    chunk, extra = divmod(total, world_size)
    start = rank * chunk + min(rank, extra)
    return range(start, start + chunk + (1 if rank < extra else 0))


def client_rows(commands: Sequence[Any], total: int) -> int | list[int]:
    """The rows the clients cover: `total` (every row) when their ranks make up the whole world, else the rows of
    their blocks."""
    shares: set[tuple[int, int]] = set()
    for command in commands:
        argv = list(command.argv)
        if "--world-size" in argv and "--rank" in argv:
            shares.add((int(argv[argv.index("--world-size") + 1]), int(argv[argv.index("--rank") + 1])))
    worlds = {w for w, _ in shares}
    if not shares or (len(worlds) == 1 and {r for _, r in shares} == set(range(next(iter(worlds))))):
        return total
    return sorted({row for w, r in shares for row in block(total, w, r)})


def dataset_rows(path: Path) -> int:
    # lazy: datasets, in the train image only
    try:
        from datasets import load_from_disk
    except ImportError as exc:
        raise MissingDependency(exc.name or "datasets", image="train") from None
    return len(load_from_disk(str(path)))


def check_files(
    output: Path, rows: int | Sequence[int], layer_ids: list[int], hidden_size: int | None
) -> tuple[int, int, str]:
    """(files, hidden size, dtype) after checking: no row without its file, and sampled files' shapes. `rows`: the
    dataset's row count (every row; files counts every file in `output`), or the rows to check (files counts theirs)."""
    # lazy: safetensors, in the image only
    from safetensors import safe_open

    wanted = range(rows) if isinstance(rows, int) else list(rows)
    absent = [r for r in wanted if not (output / f"hs_{r}.safetensors").is_file()]
    if absent:
        shown = ", ".join(map(str, absent[:10]))
        raise UserError(
            f"{len(absent)} row(s) have no hidden-state file (rows {shown})",
            source=str(output),
            fix="rerun the stage; the clients skip rows whose file exists",
        )
    step = max(1, len(wanted) // SAMPLED_FILES)
    size, dtype = hidden_size or 0, ""
    for row in wanted[::step]:
        path = output / f"hs_{row}.safetensors"
        with safe_open(str(path), framework="pt") as handle:
            keys = set(handle.keys())
            if not {"token_ids", "hidden_states"} <= keys:
                raise UserError(
                    f"keys {sorted(keys)}; expected token_ids and hidden_states", source=str(path)
                )
            states = handle.get_slice("hidden_states")
            shape = states.get_shape()
            dtype = SAFETENSORS_DTYPES.get(str(states.get_dtype()), str(states.get_dtype()))
            tokens = handle.get_slice("token_ids").get_shape()[0]
        if len(shape) != 3 or shape[0] != tokens or shape[1] != len(layer_ids):
            raise UserError(
                f"hidden_states shape {shape}; expected [{tokens}, {len(layer_ids)}, H]", source=str(path)
            )
        if size and shape[2] != size:
            raise UserError(f"hidden size {shape[2]}, expected {size}", source=str(path), field="hidden_size")
        size = shape[2]
    files = len(list(output.glob("hs_*.safetensors"))) if isinstance(rows, int) else len(wanted)
    return files, size, dtype


def check_final_layer(commands: Sequence[Any]) -> None:
    """Before any server starts: each extraction server's last captured index is its model's layer count."""
    for server in servers_of(commands):
        layers = captured_layers(server.argv)
        if layers is None:
            continue
        argv = list(server.argv)
        model = argv[argv.index("serve") + 1]
        problem = final_layer_problem(layers, read_json(Path(model) / "config.json", expect=dict), model)
        if problem:
            raise UserError(
                problem,
                field="architecture.num_layers",
                value=layers[-1],
                fix="set the model preset's architecture.num_layers to the model's num_hidden_layers",
            )


def main(args: argparse.Namespace) -> dict[str, Any]:
    commands = load_commands(args.commands)
    check_final_layer(commands)
    logs = Path(args.logs) if args.logs else Path(args.commands).parent.parent / "logs"
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    total = dataset_rows(Path(args.data))
    rows = client_rows(clients_of(commands), total)
    count = rows if isinstance(rows, int) else len(rows)
    before = len(list(output.glob("hs_*.safetensors")))
    with serving(commands, logs=logs, stage="hsextract", startup_timeout=args.startup_timeout) as group:
        codes = run_clients(commands, logs=logs, stage="hsextract", group=group)
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        name, code = next(iter(failed.items()))
        raise UserError(
            f"{len(failed)} of {len(clients_of(commands))} client(s) failed ({name}: exit {code})",
            fix=f"read logs/hsextract.{name}.log; a rerun resumes",
        )
    files, hidden, dtype = check_files(output, rows, args.layer_ids, args.hidden_size)
    write_summary(Path(args.summary), count, files, args.layer_ids, hidden, "vllm", dtype)
    if isinstance(rows, int):
        return {"rows": count, "files": files, "written": files - before, "skipped": before}
    return {"rows": count, "files": files}  # a block of a shared folder: other tasks write there too


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="the prepared dataset (speculators prepare-data output)")
    p.add_argument("--output", required=True)
    p.add_argument("--summary", required=True)
    p.add_argument("--layer-ids", type=int, nargs="+", required=True)
    p.add_argument("--hidden-size", type=int, default=None, help="checked against the files when given")
    p.add_argument("--extractor", choices=("vllm", "transformers"), required=True)


def check_main(args: argparse.Namespace) -> dict[str, Any]:
    """`hsextract-check`, after a Slurm job array: every row of the dataset has its file, sampled shapes; the
    stage's summary as a single run writes it."""
    output = Path(args.output)
    rows = dataset_rows(Path(args.data))
    files, hidden, dtype = check_files(output, rows, args.layer_ids, args.hidden_size)
    write_summary(Path(args.summary), rows, files, args.layer_ids, hidden, args.extractor, dtype)
    return {"rows": rows, "files": files}


def write_summary(
    path: Path, rows: int, files: int, layer_ids: list[int], hidden: int, extractor: str, dtype: str
) -> None:
    """The stage's summary (schema `stage-hsextract`), as a single run and the check after a job array write it."""
    summary = {
        "schema_version": 1,
        "rows": rows,
        "files": files,
        "layer_ids": list(layer_ids),
        "hidden_size": hidden,
        "extractor": extractor,
        "dtype": dtype,
    }
    check(summary, "stage-hsextract", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, summary)
