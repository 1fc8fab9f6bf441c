"""The launcher options the kit's commands share (`LAUNCHER`): which launcher runs the work, and what the Slurm
launcher asks of the cluster. `invoke benchmark` and `invoke pipeline` take their rows from here (the pipeline also
`--nodes`), and the values are checked together here once the table has parsed them:

- `executor_flags`: the Slurm flags come with `--executor slurm` (they would be silently ignored otherwise);
- `check_names`: partition, account and QOS names by the rule of the pipeline config's schema
  (`pipeline-config.schema.json#/$defs/slurm_name`). The pipeline's flags become config fields and are checked with
  the config; a benchmark has no Slurm section in its config, so its flags are checked here, by that rule.

Whether the cluster accepts them is Slurm's to say: `sbatch --test-only` (`slurm.client.test_only`), before anything
is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.options import Option, OptionTable
from draftscope.core.schema import Validator, get_schema

EXECUTORS = ("local", "slurm")

LAUNCHER = OptionTable.of(
    Option(
        "executor",
        "local: run here; slurm: the Slurm launcher, the work as batch jobs (sbatch), followed (Ctrl-C cancels them)",
        choices=EXECUTORS,
        default="local",
    ),
    Option("partition", "slurm: the partition", metavar="NAME"),
    Option("account", "slurm: the account to charge", metavar="NAME"),
    Option("qos", "slurm: the quality of service", metavar="NAME"),
    Option(
        "nodes",
        "slurm: nodes for training (torchrun, one task per node) and shards of regen and hsextract (job arrays); "
        "1 when left out",
        kind=int,
        minimum=1,
        maximum=4096,
    ),
)


NAMES = ("partition", "account", "qos")


def executor_flags(executor: str, **flags: Any) -> dict[str, Any]:
    """The Slurm flags that were given (parsed by `LAUNCHER`), checked: they need --executor slurm."""
    LAUNCHER["executor"].parse(executor)  # an unknown executor: one line listing the launchers
    given: dict[str, Any] = {k: LAUNCHER[k].parse(v) for k, v in flags.items() if v is not None}
    if given and executor != "slurm":
        first = next(iter(given))
        raise UserError(
            f"--{first} applies to the Slurm executor",
            field=f"--{first}",
            value=given[first],
            fix="add --executor slurm, or leave it out",
        )
    return given


def check_names(flags: Mapping[str, Any]) -> None:
    """--partition, --account and --qos by the pipeline config's rule for Slurm names."""
    rule = get_schema("pipeline-config")["$defs"]["slurm_name"]
    validator = Validator(rule)  # the kit's: `$` in the rule's pattern means the end of the name
    for name in NAMES:
        value = flags.get(name)
        if value is not None and not validator.is_valid(value):
            raise UserError(
                str(rule.get("description", "not a Slurm name")),
                field=f"--{name}",
                value=value,
                fix=rule.get("x-fix", "letters, digits, '.', '_', '+' and '-'"),
            )
