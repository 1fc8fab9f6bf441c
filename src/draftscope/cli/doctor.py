"""The host and the kit: `doctor` (what this machine offers) and `version` (DOCTOR_TASKS)."""

from __future__ import annotations

from typing import Any

from draftscope.bench.options import PLAN
from draftscope.cli.command import command
from draftscope.cli.render import print_json
from draftscope.core.options import OptionTable
from draftscope.core.provenance import kit_info
from draftscope.ops import doctor as D

DOCTOR = OptionTable.of(PLAN.only("json").changed("json", help="print the report as JSON"))


@command(table=DOCTOR)
def doctor(c, **values):
    """Report the host: GPUs, driver, memory, disk, container engine, images.

    Report the host: NVIDIA GPUs and dtype policy, driver/CUDA, memory, disk, container engine, kit images."""
    report = D.collect()
    if values["json"]:
        print_json(report)
    else:
        print("\n".join(D.render(report)))


@command
def version(c):
    """Print the kit's version (and git commit when run from a checkout)."""
    print(f"draftscope {version_text(kit_info())}")


def version_text(info: dict[str, Any]) -> str:
    """`0.1.0`, or `0.1.0 (abcdef123456+dirty)` from a checkout."""
    commit = (
        f" ({info['git_commit'][:12]}{'+dirty' if info['git_dirty'] else ''})" if info["git_commit"] else ""
    )
    return f"{info['version']}{commit}"


DOCTOR_TASKS = (doctor, version)
