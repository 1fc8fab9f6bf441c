"""What a pin bump would change for the kit: `invoke contracts.diff vllm==0.32.0`.

The kit's *surface* on an upstream package (`surface`: every flag, config field, metric name, Literal value and
symbol it uses, taken from its own argv builders and declared constants) is looked up in two releases' wheels
(`wheels`, read with `ast`, never imported; `reading`, `clis` and `forms` say what each item is there), and the
items whose form differs are the diff (`diff`). The contract tier reads the pinned releases through the same
`wheels` module.
"""

from __future__ import annotations

from draftscope.ops.contracts.diff import Change, Diff, diff_releases
from draftscope.ops.contracts.packages import PACKAGES, Package, parse_spec

__all__ = ["PACKAGES", "Change", "Diff", "Package", "contracts_diff", "parse_spec"]


def contracts_diff(spec: str) -> Diff:
    """The pinned release of the package `spec` names (`NAME==VERSION`) against that version, over the kit's
    surface; no changes when they agree on every item."""
    package, version = parse_spec(spec)
    pinned = package.pinned()
    items = package.surface()
    before = package.sources(pinned)
    after = before if version == pinned else package.sources(version)
    return diff_releases(package.name, items, (pinned, before), (version, after))
