"""Frozen, typed configuration loaded from YAML, validated at the edge.

The JSON Schema of each config kind is the one statement of what is valid (types, ranges, enums, unknown
keys): a file is first checked against it, then turned into frozen dataclasses for typed access. `--opts
key=value` overrides are applied before validation, so they meet exactly the same checks.

YAML is read within the reading boundary (`core.reading`): `load_yaml` reads a regular file of bounded size and
parses it with a strict safe loader that refuses anchors and aliases, duplicate keys, deep nesting, overlong and
non-finite numbers, each as a UserError naming the file, the line and the fix. `--opts` values use the same loader.
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
from draftscope.core.reading import MAX_DEPTH, MAX_NUMBER_CHARS, decode_utf8, read_bytes

T = TypeVar("T")


# A config, a preset, a study protocol is a few KiB; the pure-Python YAML parser takes seconds per MiB, so a YAML
# file has a smaller limit than a JSON one (reading.MAX_FILE_BYTES).
MAX_YAML_BYTES = 4 * 2**20


class _Refused(yaml.MarkedYAMLError):
    """A YAML document the reading boundary refuses (not a syntax error): an anchor or alias, a key twice, nesting
    past MAX_DEPTH, an overlong or non-finite number."""

    def __init__(self, problem: str, fix: str, mark: Any) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` within the reading boundary's limits.

    No anchors or aliases at all: refused at the first one, before anything is expanded, so an alias bomb (a few
    lines that expand to billions of items) or a self-referencing alias never exists. Also refused: a key twice in
    one mapping (yaml.safe_load keeps the last silently), collections nested deeper than MAX_DEPTH (the composer
    recurses per level), number literals longer than MAX_NUMBER_CHARS and non-finite floats (.nan, .inf)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                "YAML anchors and aliases are not accepted",
                "write the repeated values out in full (no &anchor or *alias)",
                event.start_mark,
            )
        nested = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        self._depth += nested
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    f"nested deeper than {MAX_DEPTH} levels",
                    f"flatten the document (at most {MAX_DEPTH} levels of nesting)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= nested

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner looks ahead over every open `[`/`{` of a line (each may start a key) before the composer
        # sees the first one: refuse deep flow nesting here, as it is scanned, not after.
        if self.flow_level >= MAX_DEPTH:
            raise _Refused(
                f"nested deeper than {MAX_DEPTH} levels",
                f"flatten the document (at most {MAX_DEPTH} levels of nesting)",
                self.get_mark(),
            )
        super().fetch_flow_collection_start(token_class)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = lines.get(key)
                except TypeError:  # an unhashable key: the SafeLoader refuses it itself
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _Refused(
                        f"the key {key!r} appears twice in one mapping (lines {first} and {line})",
                        "keep one of the two entries",
                        None,
                    )
                lines[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        _check_number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> float:
        _check_number(node)
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"{node.value} is not a finite number", "give a finite number", node.start_mark)
        return value


def _check_number(node: Any) -> None:
    if len(str(node.value)) > MAX_NUMBER_CHARS:
        raise _Refused(
            f"a number literal of {len(str(node.value))} characters (the limit is {MAX_NUMBER_CHARS})",
            "give numbers of ordinary size; quote a long digit string to make it a string",
            node.start_mark,
        )


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def _yaml(text: str) -> Any:
    """One YAML document through _StrictLoader; raises yaml.YAMLError (a refusal is a `_Refused`)."""
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(data: bytes | str, source: str, *, expect: type | tuple[type, ...] | None = None) -> Any:
    """One YAML document (a file's bytes or text) within the reading boundary's limits; every failure is a
    UserError naming `source`, the line and the fix."""
    text = data if isinstance(data, str) else decode_utf8(data, source)
    fix: str | None = None
    try:
        value = _yaml(text)
    except _Refused as exc:
        problem, fix = f"{exc.problem}{_at(exc)}", exc.fix
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0] or "invalid YAML"
        problem = f"not valid YAML{_at(exc)}: {problem}"
        fix = (
            "use plain YAML mappings, lists and scalars (no !!python tags, no list or mapping as a key)"
            if isinstance(exc, yaml.constructor.ConstructorError)
            else "fix the YAML syntax"
        )
    except RecursionError:
        problem = f"nested deeper than {MAX_DEPTH} levels"
        fix = f"flatten the document (at most {MAX_DEPTH} levels of nesting)"
    except (ValueError, OverflowError) as exc:  # a value the SafeLoader cannot build (a date 2025-02-30)
        problem, fix = f"a value cannot be read: {exc}", "correct the value, or quote it to make it a string"
    else:
        if expect is None or isinstance(value, expect):
            return value
        kinds = expect if isinstance(expect, tuple) else (expect,)
        wanted = " or ".join({dict: "a mapping", list: "a list"}.get(k, k.__name__) for k in kinds)
        found = {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)
        problem, fix = f"expected {wanted} at the top level, got {found}", f"give {wanted}"
    raise UserError(problem, source=source, fix=fix)


def _at(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""


def load_yaml(
    path: Path, *, expect: type | tuple[type, ...] | None = None, limit: int = MAX_YAML_BYTES
) -> Any:
    """A YAML file through the reading boundary (reading.read_bytes: a regular file of at most `limit` bytes,
    then `parse_yaml`): errors name the file, the line and the fix."""
    path = Path(path)
    return parse_yaml(read_bytes(path, limit=limit), str(path), expect=expect)


def parse_opts(opts: Iterable[str]) -> dict[str, Any]:
    """`["a.b=1", "name=x"]` → `{"a": {"b": 1}, "name": "x"}`; values are YAML scalars or flow lists.

    Values are data: they are parsed with the safe loader of `load_yaml` (no anchors, aliases or deep nesting) and
    never reach a shell.
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
            value = _yaml(raw) if raw.strip() else ""
        except _Refused as exc:
            raise UserError(exc.problem or "not accepted", field="--opts", value=item, fix=exc.fix) from None
        except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
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


def typed_by(
    flags: Mapping[str, str] | None, given: Mapping[str, Any], later: Mapping[str, Any]
) -> dict[str, str]:
    """The option behind each field of `given` (`flags`: dotted field → flag), unless `--opts` (`later`) set the
    field again, and `--opts FIELD` behind each field `later` sets: `{"device": "--device", "seed": "--opts seed"}`."""

    def has(tree: Mapping[str, Any], dotted: str) -> bool:
        node: Any = tree
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return True

    def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, Mapping) else (f"{prefix}{key}",)

    typed = {f: flag for f, flag in (flags or {}).items() if has(given, f) and not has(later, f)}
    return typed | {path: f"--opts {path}" for path in leaves(later)}


def validated_as_typed(data: Any, schema: str, source: str, typed: Mapping[str, str]) -> dict[str, Any]:
    """`validated`, except that a problem with a field an option set (`typed`, from `typed_by`) is reported as that
    option's, as the user typed it (`--device: unknown …`), not as the file behind the config's."""
    for problem in schemas.problems(data, schema) if typed and isinstance(data, dict) else ():
        field = problem.path.removeprefix("$.")
        if field in typed:
            raise UserError(problem.message, field=typed[field])
    return validated(data, schema, source)


def build_as_typed(cls: type[T], data: Mapping[str, Any], typed: Mapping[str, str]) -> T:
    """`build`, with a rule's error about a field an option set named by that option."""
    try:
        return build(cls, data)
    except UserError as exc:
        if exc.source is None and exc.field in typed:
            raise UserError(exc.message, field=typed[exc.field], value=exc.value, fix=exc.fix) from None
        raise
