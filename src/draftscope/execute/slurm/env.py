"""Every SLURM_* variable the kit reads, read here only: what a process inside a Slurm job learns of its job from the
environment Slurm gives it (a job script's own `$SLURM_…` words are `script`'s). Each is read when asked, so a test
sets the variable and calls; outside a job every answer is None.
"""

from __future__ import annotations

import os

JOB_ID = "SLURM_JOB_ID"  # unique per job, and per task of an array
ARRAY_JOB_ID = "SLURM_ARRAY_JOB_ID"  # an array task: the array's id
ARRAY_TASK_ID = "SLURM_ARRAY_TASK_ID"  # an array task: its index
JOB_NODELIST = "SLURM_JOB_NODELIST"  # the allocation's nodes, in Slurm's compressed form
NNODES = "SLURM_NNODES"  # the allocation's node count
NODEID = "SLURM_NODEID"  # this node's index in the allocation (one srun task per node)


def job_id() -> str | None:
    return os.environ.get(JOB_ID) or None


def array_job_id() -> str | None:
    return os.environ.get(ARRAY_JOB_ID)


def array_task_id() -> str | None:
    return os.environ.get(ARRAY_TASK_ID)


def node_list() -> str | None:
    return os.environ.get(JOB_NODELIST)


def node_count() -> str | None:
    return os.environ.get(NNODES)


def node_id() -> str | None:
    return os.environ.get(NODEID)
