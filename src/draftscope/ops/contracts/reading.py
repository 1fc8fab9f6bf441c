"""Definitions read out of a release's parsed sources: where a name is defined, a class's fields, methods and
`self` attributes, the strings a `Literal[...]` admits, the string constants of a module.

Every lookup that finds nothing raises `Missing` (a `KeyError`): the other release of a diff may lack a module,
a class or a field, and the caller records that as the item's form ("absent") instead of failing. The contract
tier uses the same lookups, where a `Missing` fails the test. Only `NotInRelease` (a name the release imports from
elsewhere: the standard library, a dependency) is passed over where a lookup goes on without it: a base class or
an annotation name the release itself should define but does not is a `Missing`, never a silent empty answer.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
from collections.abc import Iterator

from draftscope.ops.contracts.wheels import Release


class Missing(KeyError):
    """A module, class or name that the release does not define."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "missing"


class NotInRelease(Missing):
    """A name defined outside the release (the standard library, a dependency)."""


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those under `if TYPE_CHECKING:` / `try:` blocks."""
    for node in body:
        if isinstance(node, ast.If):
            yield from statements(node.body)
            yield from statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from statements(block)
        else:
            yield node


def tree(release: Release, module: str) -> ast.Module:
    try:
        return release.tree(module)
    except KeyError:
        raise Missing(f"no module {module}") from None


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def lazy_imports(release: Release, module: str) -> dict[str, str]:
    """A package's lazy-import table (`MODULE_ATTRS = {"Name": ".sub.module:Name"}`), resolved to absolute."""
    for node in statements(tree(release, module).body):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets
        ):
            with contextlib.suppress(ValueError):
                table = ast.literal_eval(node.value)
                return {k: (module + v if v.startswith(".") else v) for k, v in table.items()}
    return {}


def definition(release: Release, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST]:
    """Where `module.name` is defined: follows lazy-import tables, `from … import`, and `A = B` aliases."""
    if depth >= 10:
        raise Missing(f"alias chain too long at {module}.{name}")
    if not release.has_module(module):
        raise NotInRelease(f"{module}.{name} is outside the release")
    lazy = lazy_imports(release, module)
    if name in lazy and ":" in lazy[name]:
        target_module, target_name = lazy[name].split(":", 1)
        return definition(release, target_module, target_name, depth + 1)
    is_package = release.path_of(module).endswith("__init__.py")
    for node in statements(tree(release, module).body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return module, node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return module, node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            if isinstance(node.value, ast.Name) and node.value.id != name:
                return definition(release, module, node.value.id, depth + 1)
            return module, node
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return definition(release, _absolute(module, node, is_package), alias.name, depth + 1)
    if hasattr(builtins, name):
        raise NotInRelease(f"{name} is a builtin")
    raise Missing(f"{name} is not defined in {module}")


def cls(release: Release, module: str, name: str) -> tuple[str, ast.ClassDef]:
    where, node = definition(release, module, name)
    if not isinstance(node, ast.ClassDef):
        raise Missing(f"{module}.{name} is not a class")
    return where, node


def fields(release: Release, module: str, name: str, depth: int = 0) -> dict[str, ast.AnnAssign]:
    """Annotated class attributes (dataclass / pydantic / msgspec / TypedDict fields), bases included."""
    where, node = cls(release, module, name)
    found: dict[str, ast.AnnAssign] = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id != name and depth < 10:
            with contextlib.suppress(NotInRelease):  # msgspec.Struct, TypedDict, NamedTuple, …
                found |= fields(release, where, base.id, depth + 1)
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            found[stmt.target.id] = stmt
    return found


def methods(release: Release, module: str, name: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    _, node = cls(release, module, name)
    return {s.name: s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


def self_attributes(node: ast.AST) -> set[str]:
    """Attributes assigned on `self` anywhere inside `node` (plain and annotated assignments)."""
    found = set()
    for sub in ast.walk(node):
        targets = (
            sub.targets
            if isinstance(sub, ast.Assign)
            else [sub.target]
            if isinstance(sub, ast.AnnAssign)
            else []
        )
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found.add(t.attr)
    return found


def literal_values(release: Release, module: str, node: ast.expr | None, depth: int = 0) -> set[str]:
    """The strings a `Literal[...]` annotation (or an alias of one, or a union of such aliases) admits."""
    if node is None or depth > 10:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        try:
            where, found = definition(release, module, node.id)
        except NotInRelease:
            return set()  # str, a typing construct, …: admits no particular string
        if isinstance(found, ast.Assign):  # an alias such as `ModelDType = Literal[...]`
            return literal_values(release, where, found.value, depth + 1)
        return set()
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head in ("Literal", "typing.Literal"):
            return {str(i.value) for i in items if isinstance(i, ast.Constant)} | set().union(
                *(
                    literal_values(release, module, i, depth + 1)
                    for i in items
                    if not isinstance(i, ast.Constant)
                )
            )
        if head in ("Optional", "Union", "typing.Optional", "typing.Union", "Annotated"):
            if head == "Annotated":
                items = items[:1]
            return set().union(*(literal_values(release, module, i, depth + 1) for i in items))
        return set()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return literal_values(release, module, node.left, depth + 1) | literal_values(
            release, module, node.right, depth + 1
        )
    return set()


def string_constants(release: Release, module: str) -> set[str]:
    """Every string constant of a module, as Python joins them (adjacent literals merged)."""
    return {
        n.value
        for n in ast.walk(tree(release, module))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
