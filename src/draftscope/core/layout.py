"""The names of a run directory's files, shared by the code that writes a run (core.rundir) and the code that
checks one (core.validate)."""

from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
SUMMARY = "summary.json"
# The schema of the frozen `config` inside a manifest, by run kind; checked at creation and by `validate`.
CONFIG_SCHEMAS = {"benchmark": "experiment", "reproduce": "experiment"}


# A benchmark submitted as a batch job keeps its job files beside the run: `<run>.slurm/`.
BATCH_SUFFIX = ".slurm"


def slurm_folder_of(output: Path) -> Path:
    """Where a benchmark run's batch-job files live (ledger, job script, frozen config): beside the run, not in it."""
    output = Path(output).absolute()
    return output.parent / f"{output.name}{BATCH_SUFFIX}"
