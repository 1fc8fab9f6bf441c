"""Option tables: each option of a command written once — flag, config field, type, help, bounds, default.

As speculators builds its CLI from one typed field per flag (`train/config/schema.py`) and guidellm its click options
from pydantic fields (`utils/click_pydantic.py`), a command of the kit declares an `OptionTable` of `Option` rows,
and everything else is made from it:

- the command's parameters and help (`cli.command`: the task's signature, each option's type and default);
- the one parse of the values typed (`OptionTable.parse`: text → int / float / bool / a choice, bounds checked, each
  failure one line naming the flag as typed, the value and the fix);
- the config overrides they stand for (`OptionTable.overrides`: `--capture-head 200` → `{"head": {"capture": 200}}`)
  and, for the errors a whole config's validation finds, which flag set a field (`OptionTable.flags`);
- the JSON Schema of the fields the options set (`OptionTable.schema_properties`, `OptionTable.apply_schema`): the
  committed schema holds exactly these fragments (a test regenerates it).

The flag is the row's name with dashes (`max_seconds` → `--max-seconds`); no other spelling exists. A row with a
`field` sets that (dotted) config field, and its default is the preset's; a row without one is the command's own
(`--output`, `--dry-run`) and carries its default here.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from draftscope.core.errors import UserError

KINDS = (str, int, float, bool)
# What a value of each kind is called in help text and errors.
TYPE_NAMES = {str: "TEXT", int: "INT", float: "NUMBER", bool: ""}


@dataclass(frozen=True)
class Option:
    """One option of a command: its one spelling, what it sets, what it accepts."""

    name: str  # the keyword; the flag is `--` + name with dashes
    help: str
    kind: type = str
    field: str | None = None  # the dotted config field it sets; None: the command's own option
    choices: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None  # an exclusive minimum
    nullable: bool = False  # the field may be null in a config (a preset's "none")
    schema: Mapping[str, Any] | None = None  # the field's schema, where a generated one cannot say it ($refs)
    fix: str | None = None  # the fix an error about this value gives (the schema's x-fix)
    default: Any = None  # a command option's default (a field's is the preset's)
    default_text: str | None = None  # the default in words, where the command works it out
    repeatable: bool = False
    positional: bool = False
    required: bool = False  # the command needs it: the help says so, the parse refuses its absence
    metavar: str | None = None  # the value's name in help (default: its type, or the positional's name)
    sets: Any = True  # a flag (kind bool) that sets its field sets it to this

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name}: kind must be one of {KINDS}")  # a bug in a table
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"option {self.name!r}: a lower-case Python name")

    @property
    def flag(self) -> str:
        dashed = self.name.replace("_", "-")
        if self.positional:
            return dashed.upper()
        # one letter: invoke's spelling, `-k`, the only one it parses
        return f"-{dashed}" if len(dashed) == 1 else f"--{dashed}"

    @property
    def allowed(self) -> tuple[str, ...]:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    @property
    def value_name(self) -> str:
        if self.metavar:
            return self.metavar
        if self.positional:
            return self.name.upper()
        return "|".join(self.allowed) if self.allowed and len(self.allowed) <= 4 else TYPE_NAMES[self.kind]

    def type_text(self) -> str:
        """What the value is, for help: `integer 1–1000`, `one of cuda, cpu`, `number > 0`, `repeatable`."""
        parts = []
        if self.allowed:
            parts.append("one of " + ", ".join(self.allowed))
        elif self.kind in (int, float):
            parts.append({int: "integer", float: "number"}[self.kind])
            parts.append(_bounds(self))
        if self.repeatable:
            parts.append("repeatable")
        return " ".join(p for p in parts if p)

    # --- parsing ----------------------------------------------------------------------------------------------

    def parse(self, raw: Any) -> Any:
        """The value typed, as its kind; None (and False for a flag) means not given."""
        if self.repeatable:
            items = [] if raw is None else raw if isinstance(raw, (list, tuple)) else [raw]
            return [self._one(item) for item in items] or None
        return self._one(raw)

    def _one(self, raw: Any) -> Any:
        if raw is None:
            return None
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            raise UserError("takes no value", field=self.flag, value=raw, fix=f"write {self.flag} alone")
        text = raw if isinstance(raw, str) else str(raw)
        check_text(text, self.flag)
        value: Any = text
        if self.kind is int:
            value = self._number(int, "an integer", text)
        elif self.kind is float:
            value = self._number(float, "a number", text)
            if not math.isfinite(value):
                raise UserError("expected a finite number", field=self.flag, value=raw, fix=self.fix)
        if self.allowed and value not in self.allowed:
            raise UserError(
                f"unknown {self.name.replace('_', ' ')} '{value}'",
                field=self.flag,
                fix=self._choice_fix(text),
            )
        self._check_bounds(value, raw)
        return value

    def _number(self, kind: type, what: str, text: str) -> Any:
        try:
            return kind(text.strip())
        except (TypeError, ValueError, OverflowError):
            raise UserError(f"expected {what}", field=self.flag, value=text, fix=self.fix) from None

    def _check_bounds(self, value: Any, raw: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        problem = None
        if self.minimum is not None and value < self.minimum:
            problem = f"must be at least {_num(self.minimum)}"
        elif self.above is not None and value <= self.above:
            problem = f"must be more than {_num(self.above)}"
        elif self.maximum is not None and value > self.maximum:
            problem = f"must be at most {_num(self.maximum)}"
        if problem:
            raise UserError(problem, field=self.flag, value=raw, fix=self.fix)

    def _choice_fix(self, text: str) -> str:
        near = difflib.get_close_matches(text, self.allowed, n=1)
        return (f"did you mean '{near[0]}'? " if near else "") + f"choose one of: {', '.join(self.allowed)}"

    # --- the field's schema -----------------------------------------------------------------------------------

    def fragment(self) -> dict[str, Any]:
        """The JSON Schema of the field this option sets: the row's own `schema`, else one made from its kind."""
        if self.schema is not None:
            made = copy.deepcopy(dict(self.schema))
        else:
            made = {} if self.allowed else {"type": _JSON_TYPES[self.kind]}
            if self.allowed:
                made["enum"] = list(self.allowed)
            for key, bound in (("minimum", self.minimum), ("maximum", self.maximum)):
                if bound is not None:
                    made[key] = bound
            if self.above is not None:
                made["exclusiveMinimum"] = self.above
            if self.kind is str and not self.allowed:
                made["minLength"] = 1
            if self.nullable:
                made = {"oneOf": [made, {"type": "null"}]}
        made = {"description": self.help, **made}
        if self.fix:
            made["x-fix"] = self.fix
        return made


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _bounds(option: Option) -> str:
    low, high, above = option.minimum, option.maximum, option.above
    if low is not None and high is not None:
        return f"{_num(low)}–{_num(high)}"
    parts = []
    if above is not None:
        parts.append(f"> {_num(above)}")
    if low is not None:
        parts.append(f">= {_num(low)}")
    if high is not None:
        parts.append(f"<= {_num(high)}")
    return ", ".join(parts)


def _num(value: float) -> str:
    return f"{value:,g}" if abs(value) < 1e6 else f"{int(value):,}"


@dataclass(frozen=True)
class OptionTable:
    """A command's options, in the order its help lists them."""

    rows: tuple[Option, ...]
    by_name: Mapping[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [row.name for row in self.rows]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"options named twice: {twice}")  # a bug in a table
        object.__setattr__(self, "by_name", {row.name: row for row in self.rows})

    @classmethod
    def of(cls, *rows: Option | OptionTable) -> OptionTable:
        out: list[Option] = []
        for row in rows:
            out.extend(row.rows if isinstance(row, OptionTable) else (row,))
        return cls(tuple(out))

    def __iter__(self) -> Iterator[Option]:
        return iter(self.rows)

    def __getitem__(self, name: str) -> Option:
        return self.by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def only(self, *names: str) -> OptionTable:
        """These rows, as they are (another command's options that mean the same)."""
        return OptionTable(tuple(self[n] for n in names))

    def changed(self, name: str, **changes: Any) -> OptionTable:
        """The table with one row changed (e.g. a help text that reads differently for this command)."""
        return OptionTable(tuple(replace(r, **changes) if r.name == name else r for r in self.rows))

    @property
    def positional(self) -> list[str]:
        return [r.name for r in self.rows if r.positional]

    # --- values -----------------------------------------------------------------------------------------------

    def parse(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every row's value, parsed (None where not given; a command option's default where it has one)."""
        unknown = sorted(set(given) - set(self.by_name))
        if unknown:
            raise ValueError(f"not options of this table: {unknown}")  # a bug in a caller
        out = {}
        for row in self.rows:
            raw = given.get(row.name)
            value = row.parse(raw)
            if (value is None or value is False) and row.field is None and row.default is not None:
                value = row.default
            if row.required and value in (None, ""):
                raise UserError(
                    "no value given", field=row.flag, fix=row.fix or f"add {row.flag} {row.value_name}"
                )
            out[row.name] = value
        return out

    def overrides(self, parsed: Mapping[str, Any]) -> dict[str, Any]:
        """The config overrides the parsed values stand for, nested by field; what was not given is left out."""
        out: dict[str, Any] = {}
        for row in self.rows:
            value = parsed.get(row.name)
            if row.field is None or value is None or value is False:
                continue
            node = out
            *parents, leaf = row.field.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = row.sets if row.kind is bool else value
        return out

    def flags(self) -> dict[str, str]:
        """The flag that sets each field: `{"head.capture": "--capture-head"}`."""
        return {row.field: row.flag for row in self.rows if row.field is not None}

    # --- the schema of the fields ---------------------------------------------------------------------------------

    def schema_properties(self) -> dict[str, dict[str, Any]]:
        """Each field's schema fragment, by dotted field."""
        return {row.field: row.fragment() for row in self.rows if row.field is not None}

    def apply_schema(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """`schema` with each field's property replaced by (or added as) the row's fragment, keys in place."""
        out = copy.deepcopy(dict(schema))
        for dotted, fragment in self.schema_properties().items():
            node = out
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node["properties"][part]
            node.setdefault("properties", {})[leaf] = fragment
        return out


def check_text(value: str, field: str) -> str:
    """`value` unless it holds a NUL byte or text that is not UTF-8 (the kit writes values into JSON records)."""
    if "\x00" in value:
        raise UserError("the value holds a NUL byte", field=field, value=value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            "the value is not valid UTF-8", field=field, value=value, fix="use a UTF-8 name or value"
        ) from None
    return value


def from_signature(
    params: Mapping[str, Any],
    help: Mapping[str, str],
    *,
    iterable: Iterable[str] = (),
    positional: Iterable[str] = (),
) -> OptionTable:
    """The table of a command declared the plain way (a function's keyword defaults and a help dict): each
    option's kind is its default's type (None: text)."""
    repeat, pos = set(iterable), set(positional)
    rows = []
    for name, default in params.items():
        kind = type(default) if type(default) in KINDS else str
        rows.append(
            Option(
                name,
                help.get(name, ""),
                kind=kind,
                default=None if default is False or name in repeat else default,
                repeatable=name in repeat,
                positional=name in pos,
            )
        )
    return OptionTable(tuple(rows))


# The rows several commands share, each written here once: the model preset (a config field of the experiment and
# of the pipeline), `--opts` (any config field by its dotted key), where the steps run, and the dry run. A command
# takes them with `SHARED.only(…)`, and `changed(…)` where its help reads differently.
SHARED = OptionTable.of(
    Option(
        "preset",
        "model preset (invoke presets lists them)",
        field="model_preset",
        schema={"$ref": "common.schema.json#/$defs/name"},
        fix="name a model preset (lower-case letters, digits, '.', '_' and '-'; invoke presets lists them), "
        "e.g. --preset tiny",
    ),
    Option(
        "opts",
        "override a config field, key=value (repeatable), e.g. repeats=3",
        repeatable=True,
        metavar="KEY=VALUE",
    ),
    Option("runtime", "where the steps run", choices=("docker", "podman", "local")),
    Option("dry_run", "print what would run (images, exact commands) and stop; creates nothing", kind=bool),
)
