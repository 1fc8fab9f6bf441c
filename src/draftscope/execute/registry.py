"""The launchers, by name: the one list `--executor` accepts. Explicit, no discovery; an unknown name is an error
listing the valid ones. A launcher is a folder here (`local/`, `slurm/`) whose `launcher.py` implements
`execute.base.Launcher`, and a batch launcher's `node.py` its in-job side (`execute.base.JobNode`)."""

from __future__ import annotations

from draftscope.core.errors import UserError
from draftscope.execute.base import BatchLauncher, JobNode, Launcher
from draftscope.execute.local.launcher import LocalLauncher
from draftscope.execute.slurm.launcher import SlurmLauncher

LAUNCHERS: dict[str, Launcher] = {"local": LocalLauncher(), "slurm": SlurmLauncher()}
NAMES = tuple(LAUNCHERS)


def get(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise UserError(
            f"unknown executor '{name}'", field="--executor", fix=f"choose one of: {', '.join(NAMES)}"
        )
    return LAUNCHERS[name]


def batch(name: str) -> BatchLauncher:
    """The launcher `name`, one that submits jobs."""
    launcher = get(name)
    if launcher.node is None:
        raise UserError(f"the {name} launcher submits no jobs", field="--executor", value=name)
    return launcher  # type: ignore[return-value]  # a launcher with a node is a batch launcher


def nodes() -> list[JobNode]:
    """The in-job sides of the batch launchers, in the order above."""
    return [launcher.node for launcher in LAUNCHERS.values() if launcher.node is not None]
