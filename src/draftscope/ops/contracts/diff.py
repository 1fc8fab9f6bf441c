"""The diff of two releases over the kit's surface: each item whose form differs, with the features it touches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from draftscope.ops.contracts.forms import ABSENT, Sources, form_of
from draftscope.ops.contracts.surface import Item


@dataclass(frozen=True)
class Change:
    item: str
    kind: str
    pinned: str  # the item's form in the pinned release
    other: str  # … and in the other one
    features: tuple[str, ...]


@dataclass(frozen=True)
class Diff:
    package: str
    pinned: str
    other: str
    items: int  # how many surface items were compared
    changes: tuple[Change, ...]
    unresolved: tuple[str, ...] = ()  # items the pinned release does not define: not read from this package

    def to_dict(self) -> dict:
        doc = asdict(self)
        doc["changes"] = [asdict(c) | {"features": list(c.features)} for c in self.changes]
        return doc


def compare(items: Sequence[Item], pinned: Sources, other: Sources) -> tuple[list[Change], list[str]]:
    """(every item whose form differs between the two releases, in surface order; the items the pinned release
    does not define).

    An item the pinned release lacks is not part of what the kit reads from this package (a key convert writes
    for SGLang is looked for in speculators' config classes too; the contract tier holds that the pinned release
    has every name the kit needs), so it is no difference. A Literal value of a flag that is absent on either side
    is left to the flag's own row (one cause, one row).
    """
    changes, unresolved = [], []
    for item in items:
        before = form_of(pinned, item.lookup)
        if before == ABSENT:
            unresolved.append(item.name)
            continue
        after = form_of(other, item.lookup)
        if before == after:
            continue
        if item.lookup[0] == "train-choice" and ABSENT in (before, after):
            continue
        changes.append(Change(item.name, item.kind, before, after, item.features))
    return changes, unresolved


def diff_releases(
    package: str, items: Sequence[Item], pinned: tuple[str, Sources], other: tuple[str, Sources]
) -> Diff:
    changes, unresolved = compare(items, pinned[1], other[1])
    return Diff(package, pinned[0], other[0], len(items), tuple(changes), tuple(unresolved))
