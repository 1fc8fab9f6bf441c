"""Contract: `invoke contracts.diff` on the real releases. The pinned vLLM and speculators against themselves
list nothing, the kit's surface resolving in them (the rest of this tier holds that every name is there); vLLM
0.32.0 (the CPU engine's build, `images/vllm-cpu`) against the pinned one gives a well-formed list, printed."""

from __future__ import annotations

import pytest

from draftscope.ops import contracts as K
from draftscope.ops.contracts.surface import KINDS

pytestmark = pytest.mark.contract

OLDER_VLLM = "0.32.0"  # the release before the pin; the vllm-cpu image runs it


def well_formed(diff: K.Diff) -> None:
    assert diff.items > 20
    for change in diff.changes:
        assert change.kind in KINDS and change.item and change.features
        assert change.pinned != change.other and change.pinned != "absent"


@pytest.mark.parametrize("name", ["vllm", "speculators", "sglang"])
def test_the_pinned_release_against_itself_lists_nothing(name):
    pinned = K.PACKAGES[name].pinned()
    diff = K.contracts_diff(f"{name}=={pinned}")
    assert (diff.pinned, diff.other, diff.changes) == (pinned, pinned, ())
    well_formed(diff)
    # The surface is read from the pinned release, not left unresolved.
    assert len(diff.unresolved) < diff.items / 5, diff.unresolved


def test_an_older_vllm_gives_a_well_formed_list():
    diff = K.contracts_diff(f"vllm=={OLDER_VLLM}")
    print(f"vllm {diff.pinned} → {OLDER_VLLM}: {len(diff.changes)} of {diff.items} items differ")
    for change in diff.changes:
        print(
            f"  {change.item} [{change.kind}]: {change.pinned} → {change.other} ({', '.join(change.features)})"
        )
    well_formed(diff)
    assert diff.other == OLDER_VLLM != diff.pinned
