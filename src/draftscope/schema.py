"""JSON Schema validation (Draft 2020-12) for every artifact, preset and config the kit reads or writes.

Schemas live in `schemas/*.schema.json`, each with an `$id`; `$ref` between them resolves through a
`referencing` registry built from that folder, so no schema is ever fetched from the network.
Errors are rendered as one line naming the file, the JSON path, the problem and, where the schema gives one
(`x-fix`), the fix.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from draftscope.errors import UserError
from draftscope.resources import schemas_dir

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
        schema = json.loads(path.read_text(encoding="utf-8"))
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
def _validator(name: str) -> Draft202012Validator:
    _, registry = _load_all()
    schema = get_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER)


def problems(instance: Any, schema: str) -> list[Problem]:
    """Every problem of `instance` against the named schema, most specific first, deterministic order."""
    validator = _validator(schema)
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    )
    out: list[Problem] = []
    for error in errors:
        out.extend(_describe(error))
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


def _describe(error: ValidationError) -> list[Problem]:
    # `anyOf`/`oneOf` failures are clearer from their best sub-error.
    if error.validator in ("anyOf", "oneOf") and error.context:
        # A branch that failed only on its type was meant for another kind of value (e.g. `null`);
        # the branch that matched the type but failed a rule says what is wrong.
        relevant = [e for e in error.context if e.validator != "type"] or list(error.context)
        best = min(relevant, key=lambda e: (-len(e.absolute_path), e.message))
        return _describe(best)
    path = json_path(error.absolute_path)
    fix = error.schema.get("x-fix") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted((error.schema.get("properties") or {}).keys())
        extra = sorted(set(error.instance) - set(allowed))
        out = []
        for key in extra:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            suggestion = f"did you mean '{hint[0]}'? " if hint else ""
            out.append(
                Problem(
                    json_path([*error.absolute_path, key]),
                    f"unknown key '{key}'; fix: {suggestion}remove it or use one of: {', '.join(allowed)}",
                )
            )
        return out
    if error.validator == "required":
        message = error.message.replace("is a required property", "is required but missing")
    elif error.validator in ("enum", "const"):
        valid = error.validator_value if error.validator == "enum" else [error.validator_value]
        message = f"{_short(error.instance)} is not allowed; valid: {', '.join(map(_short, valid))}"
    else:
        message = error.message
    if fix:
        message = f"{message}; fix: {fix}"
    return [Problem(path, message)]


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
