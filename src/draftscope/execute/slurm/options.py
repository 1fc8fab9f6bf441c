"""The Slurm flags of the kit's commands (`--executor`, `--partition`, `--account`, `--qos`, and the pipeline's
`--nodes`), parsed and checked once for `invoke pipeline` and `invoke benchmark`.

- `executor_flags`: the executor is known, and the Slurm flags come with `--executor slurm` (they would be
  silently ignored otherwise); `--nodes` is a whole number.
- `check_names`: partition, account and QOS names by the rule of the pipeline config's schema
  (`pipeline-config.schema.json#/$defs/slurm_name`). The pipeline's flags become config fields and are checked
  with the config; a benchmark has no Slurm section in its config, so its flags are checked here, by that rule.

Whether the cluster accepts them is Slurm's to say: `sbatch --test-only` (`client.test_only`), before anything
is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftscope.core.errors import UserError
from draftscope.core.schema import Validator, get_schema

EXECUTORS = ("local", "slurm")
NAMES = ("partition", "account", "qos")


def executor_flags(executor: str, **flags: str | None) -> dict[str, Any]:
    """The Slurm flags that were given, checked: they need --executor slurm; --nodes is a count."""
    if executor not in EXECUTORS:
        raise UserError(
            f"unknown executor '{executor}'", field="--executor", fix=f"choose one of: {', '.join(EXECUTORS)}"
        )
    given: dict[str, Any] = {k: v for k, v in flags.items() if v is not None}
    if given and executor != "slurm":
        first = next(iter(given))
        raise UserError(
            f"--{first} applies to the Slurm executor",
            field=f"--{first}",
            value=given[first],
            fix="add --executor slurm, or leave it out",
        )
    if "nodes" in given:
        try:
            given["nodes"] = int(str(given["nodes"]))
        except ValueError:
            raise UserError(
                "not a whole number", field="--nodes", value=given["nodes"], fix="e.g. --nodes 2"
            ) from None
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
