"""Writing the build's hashes and figures into `presets/models/tiny.yaml` → `kit_model`, nothing else.

Only the `kit_model:` block is rewritten; every other line (comments included) stays as it is, and the result is
validated against the preset schema before it replaces the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from draftscope.core.config import MAX_YAML_BYTES, parse_yaml, validated
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_text, decode_utf8, read_bytes


def write_kit_model(path: Path, *, files: Mapping[str, str], measured: Mapping[str, Any]) -> None:
    path = Path(path)
    text = decode_utf8(read_bytes(path, limit=MAX_YAML_BYTES), str(path))
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict) or not isinstance(data.get("kit_model"), dict):
        raise UserError("no kit_model section to update", source=str(path), field="kit_model")
    kit_model = dict(data["kit_model"])
    kit_model["files"] = dict(sorted(files.items()))
    # Plain scalars only (e.g. torch.__version__ is a str subclass that safe_dump refuses).
    kit_model["measured"] = {k: str(v) if isinstance(v, str) else v for k, v in measured.items()}
    block = yaml.dump(
        {"kit_model": kit_model}, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=110
    )
    new_text = replace_block(text, "kit_model", block)
    validated(parse_yaml(new_text, str(path)), "model-preset", str(path))
    atomic_write_text(path, new_text)


class _PlainDumper(yaml.SafeDumper):
    """No anchors or aliases for repeated objects: the kit's YAML reader refuses them (core/config.py)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def replace_block(text: str, key: str, block: str) -> str:
    """`text` with the top-level `key:` mapping (up to the next top-level line) replaced by `block`."""
    lines = text.splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip() == f"{key}:")
    except StopIteration:
        raise UserError(f"no top-level '{key}:' line", field=key) from None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t"):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines before the next key stay
        end -= 1
    return "".join([*lines[:start], block, *lines[end:]])
