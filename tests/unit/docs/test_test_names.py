"""Test modules are imported by their file name (the test folders have no `__init__.py`, pytest's default import
mode): two with the same name in different tiers cannot both be collected, and the clash shows only when both tiers
are collected together — in CI. Caught here instead, with every helper module the tests import by name."""

from __future__ import annotations

from collections import defaultdict

from support import ROOT


def test_every_module_under_tests_has_a_name_of_its_own():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "tests").rglob("*.py")):
        parts = path.relative_to(ROOT / "tests").parts
        if "fixtures" in parts or "__pycache__" in parts or path.name in ("conftest.py", "__init__.py"):
            continue
        seen[path.stem].append(path.relative_to(ROOT).as_posix())
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"
