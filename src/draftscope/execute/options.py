"""The launcher options the kit's commands share (`LAUNCHER`): which launcher runs the work, and what the Slurm
launcher asks of the cluster. `invoke benchmark` and `invoke pipeline` take their rows from here (the pipeline also
`--nodes`); `execute.slurm.options` checks the values together (`executor_flags`, `check_names`)."""

from __future__ import annotations

from draftscope.core.options import Option, OptionTable

EXECUTORS = ("local", "slurm")

LAUNCHER = OptionTable.of(
    Option(
        "executor",
        "local: run here; slurm: submit the work as Slurm batch jobs (sbatch) and follow them (Ctrl-C cancels them)",
        choices=EXECUTORS,
        default="local",
    ),
    Option("partition", "slurm: the partition", metavar="NAME"),
    Option("account", "slurm: the account to charge", metavar="NAME"),
    Option("qos", "slurm: the quality of service", metavar="NAME"),
    Option(
        "nodes",
        "slurm: nodes for training (srun + torchrun) and shards of regen and hsextract (job arrays); "
        "1 when left out",
        kind=int,
        minimum=1,
        maximum=4096,
    ),
)
