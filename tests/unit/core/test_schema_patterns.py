"""Schema patterns mean what JSON Schema says (ECMA-262): `$` is the end of the input.

Python's `re.search` lets `$` match just before a trailing newline, so with jsonschema's own keywords
"<40 hex>\\n" passes "^[0-9a-f]{40}$". The kit's validator (`schema.Validator`) evaluates `pattern`,
`patternProperties` and `additionalProperties` with `schema.ecma_pattern`; these tests walk every pattern of every
schema file and show that a matching string passes and the same string plus "\\n" is refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftscope.core import schema
from draftscope.core.errors import UserError
from draftscope.core.resources import schemas_dir

SCHEMA_FILES = sorted(schemas_dir().glob("*.schema.json"))
SHA = "0123456789abcdef0123456789abcdef01234567"


def _walk(node: Any, found: dict[str, set[str]], where: str) -> None:
    """Every `pattern` value and every `patternProperties` key below `node`, with the file it came from."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                found.setdefault(value, set()).add(where)
            if key == "patternProperties" and isinstance(value, dict):
                for pattern in value:
                    found.setdefault(pattern, set()).add(where)
            _walk(value, found, where)
    elif isinstance(node, list):
        for item in node:
            _walk(item, found, where)


def _patterns() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in SCHEMA_FILES:
        _walk(json.loads(path.read_text(encoding="utf-8")), found, path.name)
    return found


PATTERNS = sorted(_patterns())


def test_the_walk_finds_the_patterns_that_matter():
    assert "^[0-9a-f]{40}$" in PATTERNS  # revisions
    assert "^[a-z][a-z0-9-]*$" in PATTERNS  # patternProperties keys (pipeline-config)
    assert len(PATTERNS) >= 10


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_schema_pattern_refuses_a_trailing_newline(pattern: str, data: st.DataObject):
    value = data.draw(st.from_regex(pattern, fullmatch=True), label="value")
    assert re.search(pattern, value + "\n"), "Python's own `$` lets the newline through (the bug this guards)"
    assert schema.matches(pattern, value)
    assert not schema.matches(pattern, value + "\n")
    # ... and so does the validator, for `pattern` and for `patternProperties` (through additionalProperties).
    as_value = schema.Validator({"type": "string", "pattern": pattern})
    assert as_value.is_valid(value)
    assert not as_value.is_valid(value + "\n")
    as_key = schema.Validator(
        {"type": "object", "patternProperties": {pattern: {"type": "integer"}}, "additionalProperties": False}
    )
    assert as_key.is_valid({value: 1})
    assert not as_key.is_valid({value: "not an integer"})  # patternProperties applies to the key
    assert not as_key.is_valid({value + "\n": 1})


@pytest.mark.parametrize(
    ("pattern", "translated"),
    [
        ("^[0-9a-f]{40}$", r"^[0-9a-f]{40}\Z"),
        (r"^a\$$", r"^a\$\Z"),  # an escaped `$` is a literal dollar
        ("^[$]$", r"^[$]\Z"),  # inside a class too
        ("^[]$]+$", r"^[]$]+\Z"),  # Python reads `]` right after `[` as a member: the class goes on
        ("^[^]$]$", r"^[^]$]\Z"),
        ("(a|b$)", r"(a|b\Z)"),
        (r"^[\]$]$", r"^[\]$]\Z"),
    ],
)
def test_ecma_pattern_translates_only_the_anchor(pattern: str, translated: str):
    assert schema.ecma_pattern(pattern).pattern == translated


def test_a_revision_with_a_newline_is_refused_by_every_schema_that_pins_one():
    base = {
        "schema_version": 1,
        "name": "x",
        "backend": "transformers",
        "model_preset": "tiny",
        "model": "Org/N",
    }
    assert schema.problems({**base, "revision": SHA}, "experiment") == []
    found = schema.problems({**base, "revision": SHA + "\n"}, "experiment")
    assert [p.path for p in found] == ["$.revision"]
    with pytest.raises(UserError, match=r"\$\.revision"):
        schema.check({**base, "revision": SHA + "\n"}, "experiment", "e.yaml")


def test_a_pattern_property_key_with_a_newline_is_an_unknown_key():
    found = schema.problems({"time_limits": {"train\n": 5}}, "pipeline-config")
    assert any("unknown key 'train\n'" in p.message for p in found), found


def test_the_slurm_flags_use_the_same_rule():
    from draftscope.execute.options import check_names

    check_names({"partition": "gpu"})
    with pytest.raises(UserError, match="--partition"):
        check_names({"partition": "gpu\n"})


def test_no_schema_uses_a_keyword_that_would_read_patterns_with_pythons_dollar():
    """`unevaluatedProperties` consults `patternProperties` through jsonschema's own helper (Python's `$`)."""
    for path in SCHEMA_FILES:
        assert "unevaluatedProperties" not in path.read_text(encoding="utf-8"), path.name


@pytest.mark.parametrize("pattern", PATTERNS)
def test_patterns_use_only_constructs_both_dialects_read_alike(pattern: str):
    r"""`\d`, `\w`, `\s`, `\b` match more in Python (Unicode) than in ECMA-262; lookbehinds, inline flags and
    Python-only escapes are not portable. Character classes spelled out keep a pattern's meaning the same."""
    assert not re.search(r"\\[dDwWsSbBAZ]|\(\?[<PimsxaLu]", pattern), pattern


def test_only_the_schema_module_builds_validators():
    """A validator built elsewhere (plain Draft202012Validator) would read `$` the Python way again."""
    src = Path(schema.__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if path.name != "schema.py" and re.search(r"Draft\d+Validator\(", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
