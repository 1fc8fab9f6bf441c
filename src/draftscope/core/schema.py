"""JSON Schema validation (Draft 2020-12) for every artifact, preset and config the kit reads or writes.

Schemas live in `schemas/*.schema.json`, each with an `$id`; `$ref` between them resolves through a
`referencing` registry built from that folder, so no schema is ever fetched from the network.
Errors are rendered as one line naming the file, the JSON path, the offending value, the problem and the fix:
the schema's own `x-fix` where it gives one, else a fix derived from the constraint that failed (its type,
bounds, length, pattern description, item count, allowed values or missing key).

Over ~400 lines on purpose: loading, the `$ref` registry and the one-line rendering of every failure are one
validator.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError
from jsonschema.validators import extend
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from draftscope.core.errors import UserError
from draftscope.core.jsonio import read_json
from draftscope.core.resources import schemas_dir

BASE_URI = "https://draftscope.dev/schemas/"


@dataclass(frozen=True)
class Problem:
    """One validation failure: where (a JSON path) and what."""

    path: str
    message: str

    def render(self, source: str) -> str:
        return f"{source}: {self.path}: {self.message}"


@cache
def _load_all() -> tuple[dict[str, dict[str, Any]], Registry]:
    schemas: dict[str, dict[str, Any]] = {}
    registry: Registry = Registry()
    folder = schemas_dir()
    for path in sorted(folder.glob("*.schema.json")):
        schema = read_json(path, expect=dict)
        name = path.name.removesuffix(".schema.json")
        expected = f"{BASE_URI}{path.name}"
        if schema.get("$id") != expected:
            raise RuntimeError(f"{path}: $id must be {expected!r}")  # a bug in the kit, not user input
        schemas[name] = schema
        registry = registry.with_resource(
            expected, Resource.from_contents(schema, default_specification=DRAFT202012)
        )
    return schemas, registry


def schema_names() -> list[str]:
    return sorted(_load_all()[0])


def get_schema(name: str) -> dict[str, Any]:
    schemas, _ = _load_all()
    if name not in schemas:
        raise KeyError(f"no schema named {name!r}; known: {', '.join(sorted(schemas))}")
    return schemas[name]


@cache
def _validator(name: str) -> Any:
    _, registry = _load_all()
    schema = get_schema(name)
    Validator.check_schema(schema)
    return Validator(schema, registry=registry, format_checker=FORMATS)


# --- `pattern` as JSON Schema means it ------------------------------------------------------------------------------
#
# A JSON Schema `pattern` is an ECMA-262 regular expression, where `$` (no multiline flag) matches only at the end
# of the input. jsonschema evaluates it with Python's `re.search`, where `$` also matches just before a trailing
# newline: "<40 hex>\n" would pass "^[0-9a-f]{40}$" and reach a path, an argv or a URL. The kit's Validator
# evaluates `pattern`, `patternProperties` (and `additionalProperties`, which consults the patterns) with
# `ecma_pattern`, which gives `$` its JSON Schema meaning; the schema files stay plain, published JSON Schema.


@cache
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """A schema `pattern` compiled for Python's `re` with `$` meaning the end of the input: each `$` outside a
    character class and not escaped becomes `\\Z`."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            out.append(char)
            i += 1
            # Python takes a `]` right after `[` or `[^` as a literal member, not as the end of the class.
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):
                out.append("]")
                i += 1
            continue
        elif char == "$":
            char = r"\Z"
        out.append(char)
        i += 1
    return re.compile("".join(out))


def matches(pattern: str, value: str) -> bool:
    """Whether `value` matches a schema `pattern` as JSON Schema defines it (ECMA-262 `$`)."""
    return ecma_pattern(pattern).search(value) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not matches(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if matches(pattern, str(key)):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: dict[Any, Any], schema: dict[str, Any]) -> list[Any]:
    """The keys neither `properties` nor a `patternProperties` pattern covers."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key for key in instance if key not in properties and not any(matches(p, str(key)) for p in patterns)
    ]


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = ", ".join(repr(each) for each in sorted(extras, key=str))
        yield ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


# Draft 2020-12 with the three keywords above. `unevaluatedProperties` would consult the patterns with Python's `$`
# too; no schema uses it (tests/unit/core/test_schema_patterns.py keeps it so).
Validator = extend(
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


# RFC 3339 `date-time` (the manifests' timestamps). jsonschema checks it only with an optional package; the kit
# checks it itself, so that validation is the same on every install and in every image.
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
FORMATS = FormatChecker()


@FORMATS.checks("date-time")
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True  # formats apply to strings only; `type` says the rest
    if _DATE_TIME.fullmatch(value) is None:
        return False
    try:  # real calendar values (no 2026-02-30, no hour 25); a leap second reads as :59
        datetime.fromisoformat(re.sub(r":60(?=[.Zz+-])", ":59", value).replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def problems(instance: Any, schema: str) -> list[Problem]:
    """Every problem of `instance` against the named schema, most specific first, deterministic order."""
    validator = _validator(schema)
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    )
    out: list[Problem] = []
    for error in errors:
        out.extend(_describe(error, schema))
    return out


def check(instance: Any, schema: str, source: str) -> None:
    """Raise a one-line UserError naming `source`, the JSON path and the first problem."""
    found = problems(instance, schema)
    if found:
        more = f" (and {len(found) - 1} more problem(s))" if len(found) > 1 else ""
        raise UserError(found[0].render(source) + more)


def json_path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _describe(
    error: ValidationError, root: str, inherited_fix: str | None = None, outer_fix: str | None = None
) -> list[Problem]:
    """One-line problems for one jsonschema error: the JSON path, the value, what is wrong and the fix.

    The fix is the schema's own `x-fix` where the failing subschema (or a `$ref` to it, or an enclosing
    `oneOf`/`anyOf`) gives one; otherwise it is derived from the constraint that failed.
    """
    chain = _chain(error, root)
    group = _same_place(chain)
    # The field's own x-fix (on an enclosing oneOf/anyOf) says more than a shared definition's.
    own_fix = outer_fix or _annotation(group, "x-fix") or inherited_fix
    path = json_path(error.absolute_path)
    if error.validator in ("anyOf", "oneOf") and error.context:
        return _describe_alternatives(error, root, own_fix, chain[-1].resolver)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        return _unknown_keys(error)
    value = _short(error.instance)
    validator, expected, schema = error.validator, error.validator_value, error.schema
    fix: str | None = None
    if validator == "required":
        missing = [k for k in expected if isinstance(error.instance, dict) and k not in error.instance]
        key = next((k for k in missing if error.message.startswith(repr(k))), missing[0] if missing else "?")
        message = f"'{key}' is required but missing"
        fix = f"add '{key}'"
        hint = _property_hint(schema, key, chain[-1].resolver)
        if hint:
            fix += f": {hint}"
    elif validator in ("enum", "const"):
        valid = expected if validator == "enum" else [expected]
        listed = ", ".join(map(_short, valid))
        if own_fix and not inherited_fix:
            message = f"{value} is not allowed; valid: {listed}"
        else:
            message = f"{value} is not allowed"
            fix = f"use one of {listed}" if len(valid) > 1 else f"use {listed}"
    elif validator == "type":
        types = [expected] if isinstance(expected, str) else list(expected)
        message = f"{value} is not of type {', '.join(map(repr, types))}"
        fix = (
            f"use {_alternatives([schema], chain[-1].resolver)}"
            if _values(schema)
            else f"give {_kind(schema, types)}"
        )
    elif validator in _BOUNDS:
        message = f"{value} is {_BOUNDS[validator]} {_num(expected)}"
        fix = f"use {_kind(schema)}"
    elif validator == "minLength":
        message = f"{value} is empty" if expected == 1 else f"{value} is shorter than {expected} characters"
        fix = "give a non-empty string" if expected == 1 else f"give at least {expected} characters"
    elif validator == "maxLength":
        message = f"{value} is longer than {expected} characters"
        fix = f"shorten it to at most {expected} characters"
    elif validator == "pattern":
        message = f"{value} does not match {expected!r}"
        fix = _annotation(group, "description") or f"match the pattern {expected}"
    elif validator == "minItems" and isinstance(error.instance, list):
        count = len(error.instance)
        message = (
            f"{value} is empty" if not count else f"has {count} item(s), fewer than the minimum of {expected}"
        )
        fix = "give at least one item" if expected == 1 else f"give at least {expected} items"
    elif validator == "maxItems" and isinstance(error.instance, list):
        message = f"has {len(error.instance)} items, more than the maximum of {expected}"
        fix = f"give at most {expected} item(s)"
    elif validator == "uniqueItems" and isinstance(error.instance, list):
        repeated = _repeated(error.instance)
        message = f"{value} has repeated items ({', '.join(map(_short, repeated))})"
        fix = (
            f"remove the repeated {', '.join(map(_short, repeated))}"
            if repeated
            else "remove the repeated items"
        )
    elif validator == "format":
        message = f"{value} is not a valid {expected}"
        fix = f"give {_FORMATS.get(expected, f'a valid {expected}')}"
    elif validator == "multipleOf":
        message = f"{value} is not a multiple of {_num(expected)}"
        fix = f"use a multiple of {_num(expected)}"
    else:
        message = error.message
    if own_fix:
        fix = own_fix
    if fix:
        message = f"{message}; fix: {fix}"
    return [Problem(path, " ".join(message.split()))]


def _describe_alternatives(
    error: ValidationError, root: str, own_fix: str | None, resolver: Any
) -> list[Problem]:
    """`anyOf`/`oneOf`: the clearest branch's problem, with the enclosing schema's fix where it gives one.

    A branch that failed only on its type (or on a constant of another type) was meant for another kind of
    value (e.g. `null`); the branch that matched the type but failed a rule says what is wrong.
    """
    branches = list(error.context or ())
    relevant = [e for e in branches if not _wrong_kind(e)]
    if not relevant:  # the value is of no accepted kind at all: name every kind
        types: list[str] = []
        for e in branches:
            if e.validator == "type":
                for t in [e.validator_value] if isinstance(e.validator_value, str) else e.validator_value:
                    if t not in types:
                        types.append(t)
        branch_fix = next(
            (f for e in branches if (f := _annotation(_same_place(_chain(e, root)), "x-fix"))), None
        )
        fix = own_fix or branch_fix or f"give {_alternatives(error.validator_value, resolver)}"
        what = f"is not of type {', '.join(map(repr, types))}" if types else "is not allowed"
        message = f"{_short(error.instance)} {what}; fix: {fix}"
        return [Problem(json_path(error.absolute_path), " ".join(message.split()))]

    def rank(e: ValidationError) -> tuple[int, bool, str]:
        return (-len(e.absolute_path), _annotation(_same_place(_chain(e, root)), "x-fix") is None, e.message)

    best = min(relevant, key=rank)
    same_place = list(best.absolute_path) == list(error.absolute_path)
    outer = own_fix if same_place else None
    inherited = None
    if outer is None and same_place and best.validator in ("enum", "const") and len(branches) > 1:
        inherited = f"use {_alternatives(error.validator_value, resolver)}"
    return _describe(best, root, inherited, outer)


def _unknown_keys(error: ValidationError) -> list[Problem]:
    schema = error.schema
    allowed = sorted((schema.get("properties") or {}).keys())
    for pattern in schema.get("patternProperties") or {}:
        names = re.fullmatch(r"\^\(([\w.|-]+)\)\$", pattern)
        allowed += names.group(1).split("|") if names else [f"a key matching {pattern}"]
    extra = sorted(set(error.instance) - set(schema.get("properties") or {}), key=str)
    out = []
    for key in extra:
        if any(matches(p, str(key)) for p in schema.get("patternProperties") or {}):
            continue
        hint = difflib.get_close_matches(str(key), allowed, n=1)
        suggestion = f"did you mean '{hint[0]}'? " if hint else ""
        choices = f"remove it or use one of: {', '.join(allowed)}" if allowed else "remove it"
        out.append(
            Problem(
                json_path([*error.absolute_path, key]), f"unknown key '{key}'; fix: {suggestion}{choices}"
            )
        )
    return out


# --- deriving a fix from the schema --------------------------------------------------------------------------

_BOUNDS = {
    "minimum": "less than the minimum of",
    "maximum": "greater than the maximum of",
    "exclusiveMinimum": "not greater than",
    "exclusiveMaximum": "not less than",
}
_TYPES = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "null": "null",
    "object": "a mapping",
    "array": "a list",
}
_FORMATS = {
    "date-time": "an RFC 3339 date-time such as 2025-01-31T12:00:00Z",
    "date": "a date such as 2025-01-31",
    "uri": "an absolute URI",
}
_SCHEMA_VALUED = {"items", "additionalProperties", "not", "if", "then", "else", "propertyNames", "contains"}
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "dependentSchemas"}
_SCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}


@dataclass(frozen=True)
class _Step:
    """One schema on the way from the root schema to a failing keyword: the keyword that led here."""

    via: str | None
    schema: Any
    resolver: Any


def _chain(error: ValidationError, root: str) -> list[_Step]:
    """The schemas along the error's absolute schema path, `$ref`s followed; just the failing one if lost."""
    schemas, registry = _load_all()
    node: Any = schemas[root]
    resolver = registry.resolver(base_uri=node["$id"])
    steps = [_Step(None, node, resolver)]
    parts = list(error.absolute_schema_path)  # the last part is the failing keyword itself
    i = 0
    try:
        while i < len(parts):
            key = parts[i]
            # jsonschema leaves `$ref` out of the path: a keyword the schema lacks is its `$ref`'s.
            while isinstance(node, dict) and "$ref" in node and (key not in node or key == "$ref"):
                resolved = resolver.lookup(node["$ref"])
                node, resolver = resolved.contents, resolved.resolver
                steps.append(_Step("$ref", node, resolver))
                if key == "$ref":
                    i += 1
                    key = parts[i] if i < len(parts) else None
            if i >= len(parts) - 1:
                break
            if key in _SCHEMA_MAPS or key in _SCHEMA_LISTS:
                node = node[key][parts[i + 1]]
                i += 2
            elif key in _SCHEMA_VALUED:
                node = node[key]
                i += 1
            else:
                raise LookupError(key)
            steps.append(_Step(str(key), node, resolver))
    except (LookupError, TypeError, Unresolvable):
        pass
    if steps[-1].schema is not error.schema:
        return [_Step(None, error.schema, resolver)]
    return steps


def _same_place(chain: list[_Step]) -> list[dict[str, Any]]:
    """The failing schema and the schemas that `$ref` it (outermost first): all describe the same value."""
    group = [chain[-1].schema]
    index = len(chain) - 1
    while index > 0 and chain[index].via == "$ref":
        index -= 1
        group.insert(0, chain[index].schema)
    return [s for s in group if isinstance(s, dict)]


def _annotation(group: list[dict[str, Any]], key: str) -> str | None:
    """The outermost `key` annotation (a property's own beats the shared definition it refers to)."""
    for schema in group:
        if isinstance(schema.get(key), str) and schema[key]:
            return str(schema[key])
    return None


def _refs(schema: Any, resolver: Any) -> tuple[list[dict[str, Any]], Any]:
    """A schema and what its `$ref`s lead to, outermost first, with the resolver of the innermost."""
    group = [schema] if isinstance(schema, dict) else []
    while group and "$ref" in group[-1] and len(group) < 8:
        try:
            resolved = resolver.lookup(group[-1]["$ref"])
        except Unresolvable:
            break
        group.append(resolved.contents)
        resolver = resolved.resolver
    return group, resolver


def _property_hint(parent: dict[str, Any], key: str, resolver: Any) -> str | None:
    """What a missing property should hold: its description or x-fix, else its kind."""
    prop = (parent.get("properties") or {}).get(key)
    if prop is None:
        return None
    group, inner_resolver = _refs(prop, resolver)
    if _values(group[-1]):  # the allowed values say it best
        return _alternatives([prop], resolver)
    hint = _annotation(group, "description") or _annotation(group, "x-fix")
    for branch in group[-1].get("oneOf") or group[-1].get("anyOf") or []:
        hint = hint or _annotation(_refs(branch, inner_resolver)[0], "x-fix")
    return hint or _alternatives([prop], resolver)


def _values(schema: Any) -> bool:
    return isinstance(schema, dict) and ("const" in schema or "enum" in schema)


def _alternatives(branches: list[Any], resolver: Any) -> str:
    """'an integer >= 0 or null', "'latest' or an integer >= 0": the kinds of value the branches accept."""
    phrases: list[str] = []
    for branch in branches:
        group, inner_resolver = _refs(branch, resolver)
        inner = group[-1] if group else {}
        if "const" in inner:
            phrase = _short(inner["const"])
        elif "enum" in inner:
            phrase = "one of " + ", ".join(map(_short, inner["enum"]))
        elif isinstance(inner.get("oneOf") or inner.get("anyOf"), list):
            phrase = _alternatives(inner.get("oneOf") or inner.get("anyOf"), inner_resolver)
        elif "pattern" in inner or "format" in inner:
            phrase = _annotation(group, "description") or _kind(inner)
        else:
            phrase = _kind(inner)
        if phrase not in phrases:
            phrases.append(phrase)
    return " or ".join(phrases) or "a valid value"


def _kind(schema: Any, types: list[str] | None = None) -> str:
    """'an integer from 1 to 1000', 'a number > 0', 'a string or null': a value the schema accepts."""
    schema = schema if isinstance(schema, dict) else {}
    if types is None:
        declared = schema.get("type")
        types = [declared] if isinstance(declared, str) else list(declared or [])
    if "number" in types and "integer" in types:
        types = [t for t in types if t != "integer"]
    numeric = [t for t in types if t in ("integer", "number")]
    phrases = [_TYPES.get(t, f"a {t}") for t in types]
    if schema.get("format") in _FORMATS and "string" in types:
        phrases[types.index("string")] = _FORMATS[schema["format"]]
    bounds = _bounds(schema)
    if bounds:
        if numeric:
            index = types.index(numeric[0])
            phrases[index] = f"{phrases[index]} {bounds}"
        elif not types:
            phrases = [f"a value {bounds}"]
    return " or ".join(phrases) or "a valid value"


def _bounds(schema: dict[str, Any]) -> str:
    low = (">=", schema["minimum"]) if "minimum" in schema else None
    if "exclusiveMinimum" in schema:
        low = (">", schema["exclusiveMinimum"])
    high = ("<=", schema["maximum"]) if "maximum" in schema else None
    if "exclusiveMaximum" in schema:
        high = ("<", schema["exclusiveMaximum"])
    if low and high and low[0] == ">=" and high[0] == "<=":
        return f"from {_num(low[1])} to {_num(high[1])}"
    return " and ".join(f"{bound[0]} {_num(bound[1])}" for bound in (low, high) if bound)


def _wrong_kind(error: ValidationError) -> bool:
    """A `type` failure, or an `enum`/`const` none of whose values is of the value's JSON type."""
    if error.validator == "type":
        return True
    if error.validator in ("enum", "const"):
        valid = error.validator_value if error.validator == "enum" else [error.validator_value]
        return all(_json_type(v) != _json_type(error.instance) for v in valid)
    return False


def _json_type(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _repeated(items: list[Any]) -> list[Any]:
    seen: list[Any] = []
    repeated: list[Any] = []
    for item in items:
        if item in seen and item not in repeated:
            repeated.append(item)
        seen.append(item)
    return repeated


def _num(value: Any) -> str:
    return json.dumps(value)


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
