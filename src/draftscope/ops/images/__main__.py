"""`python -m draftscope.ops.images record-wheel [DIST]`: the step of `make dist` that records the wheel's hash."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from draftscope.core.errors import run_main
from draftscope.core.images import LOCK_FILE, checkout
from draftscope.ops.images.lockfile import kit_wheel_name, record_wheel


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m draftscope.ops.images record-wheel [DIST]`: the step of `make dist` that records the wheel's hash."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "record-wheel" or len(args) > 2:
        print("usage: python -m draftscope.ops.images record-wheel [DIST_DIR]", file=sys.stderr)
        return 2

    def record() -> int:
        digest, changed = record_wheel(checkout(), Path(args[1]) if len(args) == 2 else None)
        state = "recorded in" if changed else "already in"
        print(f"{kit_wheel_name()} sha256 {digest}: {state} images/{LOCK_FILE}")
        return 0

    return run_main(record)


if __name__ == "__main__":
    raise SystemExit(main())
