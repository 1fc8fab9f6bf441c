"""What each surface item *is* in one release: its form, in words, read from the release's sources.

A form is what the diff compares: `absent`, or for a flag `switch` / `takes a value` / `takes values` /
`takes one of: …`, for a field or symbol `present`, for a Literal value `admitted` or `not admitted (admits: …)`,
for a metric name `present`. The same item in two releases with the same form is no difference to the kit.
"""

from __future__ import annotations

import ast
import contextlib
import functools
from collections.abc import Callable

from draftscope.ops.contracts import clis
from draftscope.ops.contracts import reading as R
from draftscope.ops.contracts.surface import Lookup
from draftscope.ops.contracts.wheels import Release

ABSENT = "absent"
PRESENT = "present"
ADMITTED = "admitted"


class Sources:
    """One release of a package (and, for speculators, the hs-connectors release it requires), with the flag
    tables each command line builds read once."""

    def __init__(self, release: Release, extras: dict[str, Release | None] | None = None) -> None:
        self.release = release
        self.extras = dict(extras or {})

    @functools.cached_property
    def serve_flags(self) -> dict[str, str]:
        return clis.vllm_serve_flags(self.release)

    @functools.cached_property
    def launch_flags(self) -> dict[str, str]:
        return clis.sglang_launch_flags(self.release)

    @functools.cached_property
    def train_flags(self) -> dict[str, str]:
        return clis.train_flags(self.release, self.extras.get("hs-connectors"))

    @functools.cached_property
    def typer_commands(self) -> dict[str, str]:
        return clis.typer_commands(self.release)

    @functools.cache  # noqa: B019 -- one Sources per release per command; the cache is the point
    def typer_options(self, command: str) -> dict[str, str]:
        function = self.typer_commands.get(command)
        if function is None:
            return {}
        try:
            module, _ = R.definition(self.release, "speculators.cli", function)
            return clis.typer_options(self.release, module, function)
        except R.Missing:
            return {}

    @functools.cached_property
    def speculator_types(self) -> set[str]:
        """The speculator types registered by the config modules (`speculators/models/<type>/config.py`)."""
        found: set[str] = set()
        for name in sorted(self.release.names):
            if name.startswith("speculators/models/") and name.endswith("/config.py"):
                found |= _registered(self.release, name[:-3].replace("/", "."))
        return found

    @functools.cache  # noqa: B019 -- as above
    def entry_classes(self, package: str) -> set[str]:
        """Every name in an `EntryClass = …` of the modules of `package` (the model classes SGLang registers)."""
        found: set[str] = set()
        for module in self.release.modules_under(package):
            if "EntryClass" not in self.release.source(module):
                continue
            with contextlib.suppress(SyntaxError):
                for node in R.tree(self.release, module).body:
                    if isinstance(node, ast.Assign) and any(
                        getattr(t, "id", "") == "EntryClass" for t in node.targets
                    ):
                        value = node.value
                        elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                        found |= {e.id for e in elts if isinstance(e, ast.Name)}
        return found

    @functools.cache  # noqa: B019 -- as above
    def strings(self, module: str) -> frozenset[str]:
        return frozenset(R.string_constants(self.release, module))

    @functools.cache  # noqa: B019 -- as above
    def annotated(self, module: str) -> frozenset[str]:
        """Every annotated name assigned anywhere in a module (class fields included)."""
        return frozenset(
            n.target.id
            for n in ast.walk(R.tree(self.release, module))
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        )


def _registered(release: Release, module: str) -> set[str]:
    """The names a config module registers with `X.register("name")`."""
    found = set()
    with contextlib.suppress(R.Missing, SyntaxError):
        for node in ast.walk(R.tree(release, module)):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "register"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value)
    return found


def _admits(allowed: set[str], value: str) -> str:
    if not allowed or value in allowed:  # no Literal: any string is taken
        return ADMITTED
    return "not admitted (admits: " + ", ".join(sorted(allowed)) + ")"


def _field(s: Sources, module: str, name: str, field: str) -> str:
    return PRESENT if field in R.fields(s.release, module, name) else ABSENT


def _literal(s: Sources, module: str, name: str, field: str, value: str) -> str:
    where, _ = R.cls(s.release, module, name)
    found = R.fields(s.release, module, name)
    if field not in found:
        return ABSENT
    return _admits(R.literal_values(s.release, where, found[field].annotation), value)


def _symbol(s: Sources, module: str, name: str) -> str:
    R.definition(s.release, module, name)
    return PRESENT


def _method(s: Sources, module: str, name: str, attr: str) -> str:
    return PRESENT if attr in R.methods(s.release, module, name) else ABSENT


def _param(s: Sources, module: str, name: str, method: str, param: str) -> str:
    fn = R.methods(s.release, module, name).get(method)
    if fn is None:
        return ABSENT
    names = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
    return PRESENT if param in names else ABSENT


def _signature(s: Sources, module: str, name: str, method: str) -> str:
    fn = R.methods(s.release, module, name).get(method)
    if fn is None:
        return ABSENT
    return "(" + ", ".join(a.arg for a in [*fn.args.posonlyargs, *fn.args.args]) + ")"


def _class_attr(s: Sources, module: str, name: str, attr: str) -> str:
    """A field, an attribute set on `self` anywhere in the class, or a method / property of it."""
    _, node = R.cls(s.release, module, name)
    found = (
        set(R.fields(s.release, module, name))
        | R.self_attributes(node)
        | set(R.methods(s.release, module, name))
    )
    return PRESENT if attr in found else ABSENT


def _init_attr(s: Sources, module: str, name: str, attr: str) -> str:
    init = R.methods(s.release, module, name).get("__init__")
    return PRESENT if init is not None and attr in R.self_attributes(init) else ABSENT


def _member(s: Sources, module: str, name: str, member: str) -> str:
    _, node = R.cls(s.release, module, name)
    members = {
        t.id for st in node.body if isinstance(st, ast.Assign) for t in st.targets if isinstance(t, ast.Name)
    }
    members |= {
        st.target.id for st in node.body if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
    }
    return PRESENT if member in members else ABSENT


def _listed(s: Sources, module: str, name: str, value: str) -> str:
    _, node = R.definition(s.release, module, name)
    try:
        listed = (
            ast.literal_eval(node.value)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value
            else ()
        )
    except ValueError:  # not a plain literal: the strings it names
        listed = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return ADMITTED if value in listed else "not listed"


def _string(s: Sources, module: str, value: str) -> str:
    return PRESENT if value in s.strings(module) else ABSENT


def _annotated(s: Sources, *args: str) -> str:
    *modules, name = args
    for module in modules:
        with contextlib.suppress(R.Missing):
            if name in s.annotated(module):
                return PRESENT
    return ABSENT


def _module(s: Sources, module: str) -> str:
    return PRESENT if s.release.has_module(module) else ABSENT


def _flag(table: dict[str, str], flag: str) -> str:
    return table.get(flag, ABSENT)


def _train_choice(s: Sources, flag: str, value: str) -> str:
    form = s.train_flags.get(flag)
    if form is None:
        return ABSENT  # the flag's own item says so
    choices = clis.choices_of(form)
    return ADMITTED if choices is None else _admits(set(choices), value)


FORMS: dict[str, Callable[..., str]] = {
    "field": _field,
    "literal": _literal,
    "symbol": _symbol,
    "method": _method,
    "param": _param,
    "init-attr": _init_attr,
    "signature": _signature,
    "class-attr": _class_attr,
    "member": _member,
    "listed": _listed,
    "string": _string,
    "annotated": _annotated,
    "module": _module,
    "serve-flag": lambda s, flag: _flag(s.serve_flags, flag),
    "launch-flag": lambda s, flag: _flag(s.launch_flags, flag),
    "train-flag": lambda s, flag: _flag(s.train_flags, flag),
    "train-choice": _train_choice,
    "typer-command": lambda s, command: PRESENT if command in s.typer_commands else ABSENT,
    "typer-option": lambda s, command, flag: _flag(s.typer_options(command), flag),
    "speculator-type": lambda s, draft: PRESENT if draft in s.speculator_types else ABSENT,
    "entry-class": lambda s, package, name: PRESENT if name in s.entry_classes(package) else ABSENT,
}


def form_of(sources: Sources, lookup: Lookup) -> str:
    """The item's form in this release; `absent` when a module, class or name on the way is missing."""
    how, *args = lookup
    try:
        return FORMS[how](sources, *args)
    except R.Missing:
        return ABSENT
    except SyntaxError as exc:  # a source this Python cannot parse: said, not guessed
        return f"unreadable ({exc.filename}: {exc.msg})"
