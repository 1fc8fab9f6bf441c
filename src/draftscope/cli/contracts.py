"""`invoke contracts.diff NAME==VERSION`: what bumping a pin would change for the kit
(`draftscope.ops.contracts` does the work; the task prints)."""

from __future__ import annotations

from rich.table import Table

from draftscope.bench.options import PLAN
from draftscope.cli.command import command, group
from draftscope.cli.render import console, print_json
from draftscope.core.options import Option, OptionTable
from draftscope.ops import contracts as K

DIFF = OptionTable.of(
    Option(
        "release",
        f"the release to compare with the pinned one, NAME==VERSION (NAME: {', '.join(K.PACKAGES)})",
        positional=True,
    ),
    PLAN.only("json").changed("json", help="print the differences as JSON (also when there are none)"),
)


def diff_table(diff: K.Diff) -> Table:
    table = Table(
        title=f"{diff.package} {diff.pinned} (pinned) → {diff.other}: {len(diff.changes)} of {diff.items} "
        "items the kit uses differ",
        title_justify="left",
    )
    for column in ("item", "kind", f"{diff.pinned} (pinned)", diff.other, "kit features"):
        table.add_column(column, overflow="fold")
    for change in diff.changes:
        table.add_row(change.item, change.kind, change.pinned, change.other, ", ".join(change.features))
    return table


@command(table=DIFF)
def diff(c, **values):
    """Before bumping a pin: what the kit uses that the new release changed.

    Before bumping a pin: every flag, config field, metric name, Literal value or symbol the kit uses whose form
    differs between the pinned release and RELEASE, with the kit features it touches; nothing when they agree.

    The wheels are read from $DRAFTSCOPE_RELEASE_CACHE (else ~/.cache/draftscope/releases), downloaded there with
    pip when missing; nothing is imported. Example: invoke contracts.diff vllm==0.32.0
    """
    result = K.contracts_diff(values["release"])
    if values["json"]:
        print_json(result.to_dict())
    elif result.changes:
        console().print(diff_table(result))


ns_contracts = group("contracts", diff)
