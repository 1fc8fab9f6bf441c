"""Every constraint of the user-authored schemas, broken one at a time, is refused in one line that names the JSON
path, the value and a usable fix.

The cases are generated from the schemas themselves: the walk below visits every property (following `$ref`s
through `schema.get_schema`), starts from a real valid document (the presets, examples and research files the kit
ships) and breaks each constraint it finds: its type, bounds, length, pattern, allowed values, item count, unique
items, a required key, an unknown key. A new field, or a new constraint on an old one, is covered the day it is
added, and fails here until its error carries a fix a user can act on.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from draftscope.core import schema
from draftscope.core.resources import presets_dir, repo_root
from draftscope.pipeline.config import PipelineConfig


def _load(path: Path) -> Any:
    """A YAML (or JSON) file as plain data: copied through JSON, so that no two places share a YAML alias."""
    return json.loads(json.dumps(yaml.safe_load(path.read_text(encoding="utf-8"))))


def _yaml_files(folder: Path) -> Callable[[], list[Any]]:
    return lambda: [_load(p) for p in sorted(folder.glob("*.yaml"))]


def _pipeline_examples() -> list[Any]:
    def unset(doc: Any) -> Any:  # a default of None means "not given"
        return {k: unset(v) for k, v in doc.items() if v is not None} if isinstance(doc, dict) else doc

    minimal = {"schema_version": 1, "name": "mine", "draft": "dflash", "model_preset": "tiny"}
    return [unset(PipelineConfig(**minimal).to_dict()), minimal]  # every section with the kit's defaults


# The user-authored schemas and the valid documents the cases start from (the first that has a value there).
EXAMPLES: dict[str, Callable[[], list[Any]]] = {
    "experiment": _yaml_files(presets_dir() / "experiments"),
    "pipeline-config": _pipeline_examples,
    "model-preset": _yaml_files(presets_dir() / "models"),
    "prompts": lambda: [_load(repo_root() / "examples" / "prompts.json")],
    "study": _yaml_files(repo_root() / "research" / "studies"),
    "claims": lambda: [_load(repo_root() / "research" / "claims.yaml")],
}

# A valid string for each pattern in these schemas; a new pattern needs its sample here.
PATTERN_SAMPLES = {
    "^[a-z0-9][a-z0-9._-]{0,63}$": "mine",
    "^[0-9a-f]{40}$": "0123456789abcdef0123456789abcdef01234567",
    "^[0-9a-f]{64}$": "0" * 64,
    "^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$": "Org/Name",
    "^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$": "gpu",
    "^[0-9]+[KMGT]?$": "64G",
    "^[1-9][0-9]{0,8}[kmg]$": "8g",
    "^\\{work\\}/[A-Za-z0-9._/-]+$": "{work}/out.json",
    "^([A-Za-z0-9_-]+|\\*)(\\.([A-Za-z0-9_-]+|\\*))*$": "tokens.identical",
    "^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?/[a-z0-9]+([._/-]+[a-z0-9]+)*$": "127.0.0.1:5000/draftscope/vllm",
}
FORMAT_SAMPLES = {"date-time": "2026-01-31T12:00:00Z"}

# `if`/`then` rules cannot be broken by changing one value; each has its own test below.
CONDITIONALS = {
    ("model-preset", "$", "source", "hub"),
    ("model-preset", "$", "source", "kit"),
    ("claims", "$.claims[0]", "status", "reported"),
    ("claims", "$.claims[0]", "status", "reproduced"),
}

CONSTRAINTS = (
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "enum",
    "const",
    "minItems",
    "maxItems",
    "uniqueItems",
)
UNSUPPORTED = (
    "not",
    "contains",
    "dependentRequired",
    "dependentSchemas",
    "propertyNames",
    "prefixItems",
    "$dynamicRef",
)
MISSING = object()


@dataclass(frozen=True)
class Case:
    schema: str
    path: tuple[str | int, ...]  # where the problem is reported
    rule: str
    instance: Any = None
    value: Any = MISSING  # the offending value, when the message must show it

    @property
    def id(self) -> str:
        return f"{self.schema}:{schema.json_path(self.path)}:{self.rule}"


# --- walking a schema ------------------------------------------------------------------------------------------


def _deref(node: Any, doc: str) -> tuple[list[dict[str, Any]], str]:
    """`node` and what its `$ref`s lead to (outermost first), and the schema file the last one lives in."""
    group = [node]
    while isinstance(group[-1], dict) and "$ref" in group[-1]:
        ref = group[-1]["$ref"]
        file, _, pointer = ref.partition("#")
        if file:
            doc = file.removesuffix(".schema.json")
        target: Any = schema.get_schema(doc)
        for part in filter(None, pointer.split("/")):
            target = target[part]
        group.append(target)
    return group, doc


def _inner(node: Any, doc: str) -> tuple[dict[str, Any], str]:
    group, doc = _deref(node, doc)
    return group[-1], doc


def _branches(node: dict[str, Any]) -> list[Any]:
    return list(node.get("oneOf") or node.get("anyOf") or [])


def _synth(node: Any, doc: str) -> Any:
    """The least valid value of a schema."""
    inner, doc = _inner(node, doc)
    if "const" in inner:
        return inner["const"]
    if "enum" in inner:
        return next((v for v in inner["enum"] if v is not None), None)
    if _branches(inner):
        branches = _branches(inner)
        real = [b for b in branches if _inner(b, doc)[0].get("type") != "null"] or branches
        return _synth(real[0], doc)
    types = inner.get("type", "object")
    kind = next((t for t in ([types] if isinstance(types, str) else types) if t != "null"), "null")
    if kind == "object":
        props = inner.get("properties") or {}
        return {key: _synth(props[key], doc) for key in inner.get("required", [])}
    if kind == "array":
        item = inner.get("items", {})
        count = inner.get("minItems", 0)
        if inner.get("uniqueItems") and count > 1:
            return [_synth(item, doc) + i for i in range(count)]  # integer items: distinct
        return [_synth(item, doc) for _ in range(count)]
    if kind in ("integer", "number"):
        low = inner.get("minimum", inner.get("exclusiveMinimum"))
        high = inner.get("maximum", inner.get("exclusiveMaximum"))
        if kind == "number" and low is not None and high is not None:
            return (low + high) / 2
        if low is not None:
            return low if "minimum" in inner else low + 1
        return 0 if high is None or high > 0 else high - 1
    if kind == "string":
        if "pattern" in inner:
            assert inner["pattern"] in PATTERN_SAMPLES, (
                f"add a valid sample of {inner['pattern']} to PATTERN_SAMPLES"
            )
            return PATTERN_SAMPLES[inner["pattern"]]
        if "format" in inner:
            return FORMAT_SAMPLES[inner["format"]]
        return "x" * max(1, inner.get("minLength", 1))
    return True if kind == "boolean" else None


def _types(inner: dict[str, Any]) -> set[str]:
    """The JSON types a (dereferenced) schema accepts."""
    if "const" in inner or "enum" in inner:
        values = inner["enum"] if "enum" in inner else [inner["const"]]
        return {_json_type(v) for v in values}
    declared = inner.get("type")
    types = {declared} if isinstance(declared, str) else set(declared or ())
    return types | {"integer"} if "number" in types else types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def _violations(node: Any, doc: str) -> Iterator[tuple[str, Any]]:
    """(rule, a value breaking just that rule) for every constraint of the value at one place."""
    inner, doc = _inner(node, doc)
    branches = [_inner(b, doc) for b in _branches(inner)] or [(inner, doc)]
    accepted = set().union(*(_types(b) for b, _ in branches))
    if accepted:
        wrong = next(v for v in ("text", 7, 1.5, True, [1], {"k": 1}, None) if _json_type(v) not in accepted)
        yield "type", wrong
    for branch, branch_doc in branches:
        for keyword in (k for k in CONSTRAINTS if k in branch and k != "type"):
            bound = branch[keyword]
            is_int = branch.get("type") == "integer"
            if keyword == "minimum":
                value: Any = bound - 1 if is_int else bound - 0.5
            elif keyword == "maximum":
                value = bound + 1 if is_int else bound + 0.5
            elif keyword in ("exclusiveMinimum", "exclusiveMaximum"):
                value = bound
            elif keyword == "minLength":
                value = "x" * (bound - 1)
            elif keyword == "maxLength":
                value = "x" * (bound + 1)
            elif keyword == "pattern":
                value = "Not valid!"
                assert not re.search(bound, value)
            elif keyword == "format":
                value = "not-a-date"
            elif keyword == "enum":
                value = "not-a-choice" if any(isinstance(v, str) for v in bound) else 12345
            elif keyword == "const":
                if isinstance(bound, bool):
                    value = not bound
                elif isinstance(bound, str):
                    value = bound + "-not"
                else:
                    value = 12345 if isinstance(bound, int) else "not-it"
            else:  # the item counts and uniqueness of an array
                item = _synth(branch.get("items", {}), branch_doc)
                count = {"minItems": bound - 1, "maxItems": bound + 1, "uniqueItems": 2}[keyword]
                value = [copy.deepcopy(item) for _ in range(count)]
            yield keyword, value


@dataclass(frozen=True)
class Place:
    path: tuple[str | int, ...]
    node: Any
    doc: str


STAGE_NAME = "^[a-z][a-z0-9-]*$"  # the schemas' stage-name keys (no underscore: `no_such_key` stays unknown)


def _walk(
    place: Place,
    parents: tuple[Place, ...],
    found: list[tuple[Place, tuple[Place, ...], str, Any]],
    conditionals: set[tuple[str, str, str, Any]],
    name: str,
) -> None:
    """Collect (place, its parents, rule, breaking value) for every constraint under `place`."""
    inner, doc = _inner(place.node, place.doc)
    assert not set(UNSUPPORTED) & set(inner), f"{place.path}: teach this walk {set(UNSUPPORTED) & set(inner)}"
    for rule, value in _violations(place.node, place.doc):
        found.append((place, parents, rule, value))
    for branch in _branches(inner):
        branch_inner, _ = _inner(branch, doc)
        assert not {"properties", "items"} & set(branch_inner), f"{place.path}: teach this walk nested oneOf"
    for part in inner.get("allOf", []):
        assert set(part) <= {"if", "then"}, f"{place.path}: teach this walk allOf without if/then"
        ((key, condition),) = part["if"]["properties"].items()
        conditionals.add((name, schema.json_path(place.path), key, condition["const"]))
    here = (*parents, place)
    for key in inner.get("required", []):
        found.append((place, parents, f"required:{key}", key))
    if inner.get("additionalProperties") is False:
        found.append((place, parents, "additionalProperties", "no_such_key"))
    for key, child in (inner.get("properties") or {}).items():
        _walk(Place((*place.path, key), child, doc), here, found, conditionals, name)
    for pattern, child in (inner.get("patternProperties") or {}).items():
        if pattern == STAGE_NAME:  # any stage name the registry knows (pipeline/registry.py): take a real one
            sample = "train"
        else:
            key = re.fullmatch(r"\^\(([\w.-]+)\|.*\)\$", pattern)
            assert key, f"{place.path}: teach this walk the pattern {pattern}"
            sample = key.group(1)
        _walk(Place((*place.path, sample), child, doc), here, found, conditionals, name)
    if isinstance(inner.get("additionalProperties"), dict):
        _walk(
            Place((*place.path, "some-key"), inner["additionalProperties"], doc),
            here,
            found,
            conditionals,
            name,
        )
    if isinstance(inner.get("items"), dict):
        _walk(Place((*place.path, 0), inner["items"], doc), here, found, conditionals, name)


def _at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@cache
def _examples(name: str) -> list[Any]:
    """EXAMPLES[name], read once (every case of the schema starts from a deep copy of one of them)."""
    return EXAMPLES[name]()


def _base(name: str, place: Place, parents: tuple[Place, ...]) -> Any:
    """A valid document in which the value at `place` exists (from a real example, made up where none has it)."""
    examples = _examples(name)

    def depth(example: Any) -> int:
        node, reached = example, 0
        for part in place.path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                break
            reached += 1
        return reached

    doc = copy.deepcopy(max(examples, key=depth))  # the first example that goes deepest along the path
    for index, part in enumerate(place.path):
        container = _at(doc, place.path[:index])
        target = parents[index + 1] if index + 1 < len(parents) else place
        if isinstance(part, int):
            if not container:
                container.append(_synth(target.node, target.doc))
        elif part not in container or container[part] is None:
            container[part] = _synth(target.node, target.doc)
    return doc


def _cases(name: str) -> Iterator[Case]:
    root = Place((), schema.get_schema(name), name)
    found: list[tuple[Place, tuple[Place, ...], str, Any]] = []
    conditionals: set[tuple[str, str, str, Any]] = set()
    _walk(root, (), found, conditionals, name)
    covered = {c for c in CONDITIONALS if c[0] == name}
    assert conditionals == covered, f"{name}: an if/then rule without its own test: {conditionals ^ covered}"
    for place, parents, rule, value in found:
        doc = _base(name, place, parents)
        assert schema.problems(doc, name) == [], (
            f"{name} {place.path}: the walk built an invalid base document"
        )
        if rule.startswith("required:"):
            del _at(doc, place.path)[value]
            yield Case(name, place.path, rule, doc)
        elif rule == "additionalProperties":
            _at(doc, place.path)[value] = 1
            yield Case(name, (*place.path, value), rule, doc)
        elif not place.path:
            yield Case(name, (), rule, value, value)
        else:
            _at(doc, place.path[:-1])[place.path[-1]] = value
            yield Case(name, place.path, rule, doc, value)


CASES = [case for name in EXAMPLES for case in _cases(name)]
SECONDS = re.compile(r"(_s|seconds)$")


def _fix(message: str) -> str:
    assert "; fix: " in message, message
    return message.split("; fix: ", 1)[1]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_broken_constraint_names_the_path_the_value_and_a_usable_fix(case: Case):
    found = schema.problems(case.instance, case.schema)
    path = schema.json_path(case.path)
    assert found, f"{case.id}: not refused"
    mine = [p for p in found if p.path == path]
    if case.rule.startswith(
        "required:"
    ):  # another rule may miss the same key (an `if` on an absent key holds)
        mine = [p for p in mine if f"'{case.rule.split(':', 1)[1]}' is required" in p.message]
    assert mine, f"{case.id}: reported elsewhere: {found}"
    assert all(p.path.startswith(path) for p in found), f"{case.id}: more than this value is refused: {found}"
    message = mine[0].message
    assert "\n" not in message and len(message) < 400, message
    fix = _fix(message)
    # A usable fix says what to write, not how the schema is written.
    assert "match the pattern" not in fix and "a valid value" not in fix, (
        f"{case.id}: give it an x-fix: {message}"
    )
    if case.value is not MISSING and not isinstance(case.value, (list, dict)):
        assert schema._short(case.value) in message, f"{case.id}: the message hides the value: {message}"
    if case.rule.startswith("required:"):
        assert f"'{case.rule.split(':', 1)[1]}' is required but missing" in message
        assert f"add '{case.rule.split(':', 1)[1]}'" in fix
    if case.rule == "additionalProperties":
        assert "unknown key 'no_such_key'" in message
    seconds_field = any(SECONDS.search(str(p)) for p in case.path) or "time_limits" in case.path
    if seconds_field and case.rule != "additionalProperties":
        assert "second" in fix, f"{case.id}: name the unit: {message}"


def test_the_walk_covers_every_user_schema_and_the_usual_rules():
    seen = {(c.schema, c.rule.split(":")[0]) for c in CASES}
    for name in EXAMPLES:
        assert {(name, "type"), (name, "required"), (name, "additionalProperties")} <= seen, name
    assert {rule for _, rule in seen} >= {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "pattern",
        "enum",
        "minItems",
    }
    assert len(CASES) > 300


# --- exact messages for representative cases -----------------------------------------------------------------

EXPERIMENT = {"schema_version": 1, "name": "mine", "backend": "transformers", "model_preset": "tiny"}
PIPELINE = {"schema_version": 1, "name": "mine", "draft": "dflash", "model_preset": "tiny"}
SHA = "0123456789abcdef0123456789abcdef01234567"


def _only(instance: Any, name: str) -> str:
    (problem,) = schema.problems(instance, name)
    return f"{problem.path}: {problem.message}"


@pytest.mark.parametrize(
    ("name", "instance", "expected"),
    [
        (
            "experiment",
            {**EXPERIMENT, "repeats": "many"},
            "$.repeats: 'many' is not of type 'integer'; fix: give an integer from 1 to 1000",
        ),
        (
            "experiment",
            {**EXPERIMENT, "repeats": 0},
            "$.repeats: 0 is less than the minimum of 1; fix: use an integer from 1 to 1000",
        ),
        (
            "experiment",
            {**EXPERIMENT, "seed": -1},
            "$.seed: -1 is less than the minimum of 0; fix: use an integer >= 0",
        ),
        (
            "experiment",
            {**EXPERIMENT, "max_seconds": 0},  # an explicit x-fix wins over the derived one
            "$.max_seconds: 0 is not greater than 0; fix: give the wall-clock limit in seconds (> 0, at most 604800:"
            " a week), e.g. --max-seconds 600",
        ),
        (
            "experiment",
            {**EXPERIMENT, "model": "Org/Name", "revision": "abc1234"},
            "$.revision: 'abc1234' does not match '^[0-9a-f]{40}$'; fix: pin the full 40-character commit SHA"
            " (hub page → Files and versions → the commit), or null to leave it unpinned",
        ),
        (
            "experiment",
            {**EXPERIMENT, "fixed_tokens": "all"},
            "$.fixed_tokens: 'all' is not of type 'integer', 'null'; fix: give an integer from 1 to 1048576 or null",
        ),
        (
            "experiment",
            {**EXPERIMENT, "runtime": "k8s"},
            "$.runtime: 'k8s' is not allowed; fix: use one of 'docker', 'podman', 'local'",
        ),
        (
            "experiment",
            {k: v for k, v in EXPERIMENT.items() if k != "backend"},
            "$: 'backend' is required but missing; fix: add 'backend': a benchmark backend, e.g. transformers (planning"
            " refuses a name the kit does not register and lists the valid ones)",
        ),
        (
            "pipeline-config",
            {**PIPELINE, "train": {"gpus": [0, 1, 0]}},
            "$.train.gpus: [0, 1, 0] has repeated items (0); fix: remove the repeated 0",
        ),
        (
            "pipeline-config",
            {**PIPELINE, "regen": {"base_port": 80}},
            "$.regen.base_port: 80 is less than the minimum of 1024; fix: use an integer from 1024 to 65535",
        ),
        (
            "pipeline-config",
            {
                **PIPELINE,
                "train": {"dspark": {"markov_rank": 0}},
            },  # an x-fix beside a $ref is the field's own
            "$.train.dspark.markov_rank: 0 is less than the minimum of 1; fix: SGLang refuses a DSpark draft"
            " without its Markov head: use markov_rank >= 1",
        ),
        (
            "pipeline-config",
            {**PIPELINE, "time_limits": {"Train": 60}},  # not a stage name at all; a misspelt one: planning
            "$.time_limits.Train: unknown key 'Train'; fix: remove it or use one of: a key matching ^[a-z][a-z0-9-]*$",
        ),
        (
            "prompts",
            {"schema_version": 1, "name": "mine", "prompts": []},
            "$.prompts: [] is empty; fix: give at least one item",
        ),
        (
            "prompts",
            [1, 2],
            "$: [1, 2] is not of type 'object'; fix: give a mapping",
        ),
    ],
)
def test_exact_messages(name, instance, expected):
    assert _only(instance, name) == expected


def test_a_long_value_is_shortened_in_the_message():
    message = _only({**EXPERIMENT, "name": "N" * 500}, "experiment")
    assert message.startswith("$.name: 'NNNN") and "..." in message and len(message) < 300


def test_if_then_rules_of_the_model_preset_name_the_missing_section():
    preset = _load(presets_dir() / "models" / "qwen3-8b.yaml")
    assert preset["source"] == "hub" and schema.problems(preset, "model-preset") == []
    del preset["hub"]
    message = _only(preset, "model-preset")
    assert message.startswith("$: 'hub' is required but missing; fix: ") and "source: kit" in message
    tiny = _load(presets_dir() / "models" / "tiny.yaml")
    assert tiny["source"] == "kit" and schema.problems(tiny, "model-preset") == []
    del tiny["kit_model"]
    message = _only(tiny, "model-preset")
    assert message.startswith("$: 'kit_model' is required but missing; fix: ") and "source: hub" in message


def test_if_then_rules_of_a_claim_name_the_status():
    claims = _load(repo_root() / "research" / "claims.yaml")
    i = next(i for i, c in enumerate(claims["claims"]) if c["status"] == "reported")
    claim = claims["claims"][i]
    claim["provenance"]["reproduced_here"] = True
    message = _only(claims, "claims")
    assert message.startswith(
        f"$.claims[{i}].provenance.reproduced_here: true is not allowed; valid: false; fix: "
    )
    assert "status: reproduced" in message
    claim["status"] = "reproduced"
    message = _only(claims, "claims")
    assert (
        message.startswith(f"$.claims[{i}].evidence: [] is empty; fix: ") and "research/evidence/" in message
    )
    claim["evidence"] = ["research/evidence/x/comparison.json"]
    assert claim["origin"] == "historical"  # reproduced or not, a historical claim keeps its origin
    assert schema.problems(claims, "claims") == []
    claim["provenance"]["reproduced_here"] = False
    message = _only(claims, "claims")
    assert message.startswith(
        f"$.claims[{i}].provenance.reproduced_here: false is not allowed; valid: true; fix: "
    )
    assert "status: reported" in message


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("2026-11-30T09:38:46.123272Z", True),
        ("2026-11-30T09:38:46+01:00", True),
        ("2026-12-31T23:59:60Z", True),  # a leap second
        ("2026-02-30T00:00:00Z", False),
        ("2026-11-30 09:38:46Z", False),
        ("2026-11-30T09:38:46", False),  # no offset
        ("yesterday", False),
    ],
)
def test_timestamps_are_checked_as_rfc3339_on_every_install(value, ok):
    assert schema.FORMATS.conforms(value, "date-time") is ok
