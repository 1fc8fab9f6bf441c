"""Modules of roughly 50–400 lines: a longer one says at its top why it stays one module."""

from __future__ import annotations

import ast

from support import ROOT

LIMIT = 400
REASON = "Over ~400 lines on purpose:"


def test_a_long_module_gives_its_reason():
    unexplained = []
    for path in sorted((ROOT / "src" / "draftscope").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LIMIT:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in doc:
            unexplained.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert unexplained == [], "split these, or say why at the top:\n" + "\n".join(unexplained)
