"""Pinned upstream releases for the contract tier: the kit's own release reader (`draftscope.ops.contracts.wheels`,
shared with `invoke contracts.diff`), re-exported under the names the contract tests use, and the fixture helper.

A release is its published wheel, fetched once into `$DRAFTSCOPE_RELEASE_CACHE` (else `~/.cache/draftscope/
releases`) and read without importing; nothing downloaded is committed.
"""

from __future__ import annotations

from draftscope.ops.contracts.packages import PACKAGES
from draftscope.ops.contracts.wheels import CACHE_ENV, Release, ReleaseUnavailable, cache_dir, release_wheel

__all__ = [
    "CACHE_ENV",
    "SGLANG_PLATFORM",
    "SGLANG_VERSION",
    "Release",
    "ReleaseUnavailable",
    "cache_dir",
    "pinned_release",
    "release_wheel",
]

# The pinned SGLang release (images.lock.json, the sglang image); it ships only manylinux_2_34 wheels.
SGLANG_VERSION = PACKAGES["sglang"].pinned()
SGLANG_PLATFORM = PACKAGES["sglang"].platform


def pinned_release(name: str, version: str, *, platform: str | None = None) -> Release:
    """The pinned wheel for a test fixture: the test fails (never skips) when it cannot be had."""
    import pytest

    try:
        return Release(release_wheel(name, version, platform=platform))
    except ReleaseUnavailable as exc:
        pytest.fail(str(exc))
