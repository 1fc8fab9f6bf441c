"""The front door: every command of the kit in one invoke namespace, `ns` (the checkout's tasks.py hands it to
`invoke`), and `main`, the installed `draftscope` command. Each family of commands is a module of this package."""

from __future__ import annotations

from invoke import Collection

from draftscope.cli import (
    analysis,
    bench,
    claims,
    contracts,
    datasets,
    demo,
    doctor,
    export,
    head,
    images,
    pipeline,
    reliability,
    runs,
    share,
    tiny,
)
from draftscope.cli.program import DraftscopeProgram

ns = Collection(
    *bench.BENCH_TASKS,
    *runs.RUNS_TASKS,
    *doctor.DOCTOR_TASKS,
    *analysis.ANALYSIS_TASKS,
    *export.EXPORT_TASKS,
    *pipeline.PIPELINE_TASKS,
    *head.HEAD_TASKS,
    *demo.DEMO_TASKS,
    *share.SHARE_TASKS,
    *reliability.RELIABILITY_TASKS,
    *claims.CLAIMS_TASKS,
    analysis.ns_evidence,
    tiny.ns_tiny,
    images.ns_images,
    datasets.ns_datasets,
    claims.ns_claims,
    contracts.ns_contracts,
)


# The task list's headings, by audience and purpose (`invoke --list`); every task is under one (a test checks).
GROUPS = {
    "start": ("demo", "doctor", "version"),
    "bench": ("benchmark", "plan", "presets", "datasets.list", "datasets.import", "recover", "reproduce"),
    "pipeline": ("pipeline", "tiny.build", "validate"),
    "analysis": ("analyze", "compare", "export", "share"),
    "images": ("images.build", "images.list", "images.lock", "images.pull", "images.push", "images.sbom"),
    "research": (
        "claims.list",
        "claims.reproduce",
        "kick-the-tires",
        "evidence.add",
        "evidence.verify",
        "head-bench",
        "head-study",
        "bench-overhead",
    ),
    "develop": ("reliability", "contracts.diff"),
}


def program(binary: str = "draftscope") -> DraftscopeProgram:
    """The kit's Program over `ns`: the `draftscope` command, and a checkout's `invoke` (tasks.py)."""
    return DraftscopeProgram(namespace=ns, name="draftscope", binary=binary, groups=GROUPS)


def main() -> None:
    """The `draftscope` console script: the tasks `invoke` runs in a checkout, anywhere the kit is installed."""
    program().run()
