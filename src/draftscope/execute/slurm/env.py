"""Every SLURM_* variable the kit reads, declared here (through `core.settings`, so docs/settings.md lists them and
no module reads the environment itself): what a process inside a Slurm job learns of its job from the environment
Slurm gives it (a job script's own `$SLURM_…` words are `script`'s). Each is read when asked, so a test sets the
variable and calls; outside a job every answer is None.
"""

from __future__ import annotations

from draftscope.core.settings import Variable, declare


def _slurm(name: str, doc: str) -> Variable:
    return declare(Variable(name, doc, "upstream", owner=__name__, unset="not in a Slurm job"))


JOB_ID = _slurm("SLURM_JOB_ID", "set by Slurm in a job: unique per job, and per task of an array")
ARRAY_JOB_ID = _slurm("SLURM_ARRAY_JOB_ID", "set by Slurm in an array task: the array's id")
ARRAY_TASK_ID = _slurm("SLURM_ARRAY_TASK_ID", "set by Slurm in an array task: its index")
JOB_NODELIST = _slurm(
    "SLURM_JOB_NODELIST", "set by Slurm in a job: the allocation's nodes, in its compressed form"
)
NNODES = _slurm("SLURM_NNODES", "set by Slurm in a job: the allocation's node count")
NODEID = _slurm(
    "SLURM_NODEID", "set by Slurm in a job: this node's index in the allocation (one srun task each)"
)


def job_id() -> str | None:
    return JOB_ID.raw() or None


def array_job_id() -> str | None:
    return ARRAY_JOB_ID.raw()


def array_task_id() -> str | None:
    return ARRAY_TASK_ID.raw()


def node_list() -> str | None:
    return JOB_NODELIST.raw()


def node_count() -> str | None:
    return NNODES.raw()


def node_id() -> str | None:
    return NODEID.raw()
