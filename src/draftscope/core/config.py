"""Frozen, typed configuration loaded from YAML, validated at the edge.

The JSON Schema of each config kind is the one statement of what is valid (types, ranges, enums, unknown
keys): a file is first checked against it, then turned into frozen dataclasses for typed access. `--opts
key=value` overrides are applied before validation, so they meet exactly the same checks.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from draftscope.core import schema as schemas
from draftscope.core.errors import UserError

T = TypeVar("T")


def load_yaml(path: Path) -> Any:
    """`yaml.safe_load` of a file, with errors that name the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("file not found", source=str(path), fix="check the path") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"not UTF-8 text (byte {exc.start})", source=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise UserError(f"not valid YAML{where}: {problem}", source=str(path)) from None
    return data


def parse_opts(opts: Iterable[str]) -> dict[str, Any]:
    """`["a.b=1", "name=x"]` → `{"a": {"b": 1}, "name": "x"}`; values are YAML scalars or flow lists.

    Values are data: they are parsed with `yaml.safe_load` and never reach a shell.
    """
    result: dict[str, Any] = {}
    for item in opts:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(
                "an override must look like key=value",
                field="--opts",
                value=item,
                fix="write e.g. --opts repeats=3 or --opts dflash.block_size=16",
            )
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw  # not YAML: keep the literal text; the schema decides if it is valid
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            if not part:
                raise UserError("empty component in an override key", field="--opts", value=item)
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(
                    f"'{part}' is set both as a value and as a section", field="--opts", value=item
                )
            node = child
        node[parts[-1]] = value
    return result


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` with `override` laid over it; nested mappings merge, everything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def validated(data: Any, schema: str, source: str) -> dict[str, Any]:
    """Check `data` against a schema and return it; errors name `source` and the JSON path."""
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    _require_finite(data, "$", source)
    schemas.check(data, schema, source)
    return data


def _require_finite(value: Any, path: str, source: str) -> None:
    """NaN and infinities pass every JSON Schema bound (each comparison is false) and are not JSON at all:
    refuse them wherever they appear (`--max-seconds nan`, `--opts lr=.inf`)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{path}: {value} is not a finite number", source=source, fix="give a finite number")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _require_finite(item, f"{path}.{key}", source)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _require_finite(item, f"{path}[{index}]", source)


def build(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build a frozen dataclass tree from already-validated data (unknown keys were rejected by the schema)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.name in data:
            kwargs[field.name] = _convert(hints[field.name], data[field.name])
    return cls(**kwargs)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(options[0], value) if len(options) == 1 else value
    if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return build(hint, value)
    if origin is tuple:
        (item, *_rest) = typing.get_args(hint)
        return tuple(_convert(item, v) for v in value)
    if origin in (dict, Mapping) or hint is dict:
        args = typing.get_args(hint)
        inner = args[1] if len(args) == 2 else Any
        return types.MappingProxyType({k: _convert(inner, v) for k, v in value.items()})
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def to_dict(obj: Any) -> Any:
    """The plain-JSON form of a config tree (for freezing into a manifest)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj
