"""The command lines of the upstream releases, read from their sources: flag → its form.

A form is what a flag takes, in words: `switch` (no value), `takes a value`, `takes values` (a list) or
`takes one of: a, b` (a `Literal` / choices). Each reader follows how that release builds its parser:

- vLLM's `vllm serve`: the explicit `add_argument` calls of `vllm/engine/arg_utils.py`, a flag typed bool by the
  config field its `**X_kwargs["field"]` comes from (and then with a `--no-` form), plus the frontend's fields;
- speculators' `python -m speculators CMD`: typer commands registered as `app.command(...)(function)`, their
  options the function's parameters (`Annotated[T, typer.Option("--x/--no-x")]`);
- speculators' trainer (`-m speculators.train`): one flag per field of `TrainConfig` and its groups, bools as
  `store_true` or, defaulting to True/None or tagged optional, `BooleanOptionalAction`; plus `--config` and the
  hidden-state file backend's `--hidden-states-path` (hs-connectors);
- SGLang's `launch_server`: annotated config fields (`A[type, "help"]` / `A[type, Arg(...)]` in
  `sglang/srt/arg_groups/fields/`) and the explicit `add_argument` calls of `server_args.py`.

The contract tier's tests read the pinned releases through these same readers; a module a release lacks gives no
flags, but a class a reader needs that the release does not define (a config class named by `get_kwargs`, a frontend
class, a trainer group) is a `Missing`, never a table quietly short of its flags.
"""

from __future__ import annotations

import ast
import contextlib
from typing import NamedTuple

from draftscope.ops.contracts.reading import Missing, tree
from draftscope.ops.contracts.wheels import Release

SWITCH = "switch"
VALUE = "takes a value"
VALUES = "takes values"


CHOICES = "takes one of: "


def choices_form(choices: list[str]) -> str:
    return CHOICES + ", ".join(choices)


def choices_of(form: str) -> list[str] | None:
    """The values a `takes one of: …` form admits; None for any other form."""
    return form.removeprefix(CHOICES).split(", ") if form.startswith(CHOICES) else None


def _modules_below(release: Release, package: str) -> list[str]:
    """The dotted names of the modules in one folder of the wheel and in all its subfolders, sorted."""
    folder = package.replace(".", "/") + "/"
    return sorted(
        n[:-3].replace("/", ".").removesuffix(".__init__")
        for n in release.names
        if n.startswith(folder) and n.endswith(".py")
    )


# --- vLLM --------------------------------------------------------------------------------------------------------


def class_annotations(release: Release, module: str, name: str) -> dict[str, str]:
    """A class's annotated fields → their annotations as source, from the class defined in `module` itself."""
    for node in tree(release, module).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                s.target.id: ast.unparse(s.annotation)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise Missing(f"{name} not in {module}")


def _config_class(release: Release, name: str, cache: dict[str, dict[str, str]]) -> dict[str, str]:
    """The field annotations of the config class `name`, from whichever module under vllm/config/ defines it."""
    if name not in cache:
        for module in _modules_below(release, "vllm.config"):
            with contextlib.suppress(Missing, SyntaxError):
                cache[name] = class_annotations(release, module, name)
                break
        else:
            raise Missing(f"no config class {name} under vllm/config/")
    return cache[name]


FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")


def _defining(release: Release, folder: str, classes: tuple[str, ...]) -> list[str]:
    """The modules under `folder` (any depth) whose source defines one of `classes`, sorted."""
    found = []
    for module in _modules_below(release, folder):
        text = release.source(module)
        if any(f"class {c}(" in text or f"class {c}:" in text for c in classes):
            found.append(module)
    return found


def vllm_serve_flags(release: Release) -> dict[str, str]:
    """Every `vllm serve` flag → its form (`switch` for a bool field, which also has a `--no-` form)."""
    try:
        engine = tree(release, "vllm.engine.arg_utils")
    except Missing:  # a release without the engine's argument module: no engine flags
        flags: dict[str, str] = {}
    else:
        flags = _engine_flags(release, engine)
    # The frontend's own fields (host, port, …): the module moved between releases
    # (vllm/entrypoints/launchers/cli_args.py in 0.32, vllm/entrypoints/common/cli_args.py in 0.33), so it is found.
    found = set()
    for module in _defining(release, "vllm.entrypoints", FRONTEND_CLASSES):
        for name in FRONTEND_CLASSES:
            with contextlib.suppress(Missing):
                for field, annotation in class_annotations(release, module, name).items():
                    flags["--" + field.replace("_", "-")] = SWITCH if "bool" in annotation else VALUE
                found.add(name)
    if not found:  # a release may define one of the two (a base and its subclass), never neither
        raise Missing(f"none of {', '.join(FRONTEND_CLASSES)} under vllm/entrypoints/")
    return flags


def _engine_flags(release: Release, engine: ast.Module) -> dict[str, str]:
    """The explicit `add_argument` calls of vllm/engine/arg_utils.py, each typed by the config field its
    `**X_kwargs["field"]` comes from (`X_kwargs = get_kwargs(XConfig)`)."""
    kwargs_class: dict[str, str] = {}
    for node in ast.walk(engine):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "get_kwargs"
            and node.value.args
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value.args[0], ast.Name)
        ):
            kwargs_class[node.targets[0].id] = node.value.args[0].id
    flags: dict[str, str] = {}
    classes: dict[str, dict[str, str]] = {}
    for node in ast.walk(engine):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        is_bool = False
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Subscript)
                and getattr(sub.value, "id", "") in kwargs_class
                and isinstance(sub.slice, ast.Constant)
            ):
                annotations = _config_class(release, kwargs_class[sub.value.id], classes)
                is_bool = "bool" in annotations.get(sub.slice.value, "")
        for name in names:
            flags[name] = SWITCH if is_bool else VALUE
            if is_bool:
                flags["--no-" + name[2:]] = SWITCH
    return flags


# --- speculators: typer commands ----------------------------------------------------------------------------------


def typer_commands(release: Release) -> dict[str, str]:
    """CLI command name → function name, from `app.command(...)(function)` in speculators/cli/__init__.py."""
    found: dict[str, str] = {}
    with contextlib.suppress(Missing):
        for node in ast.walk(tree(release, "speculators.cli")):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Call)
                and getattr(node.func.func, "attr", "") == "command"
                and node.args
                and isinstance(node.args[0], ast.Name)
            ):
                function = node.args[0].id
                names = [
                    k.value.value
                    for k in node.func.keywords
                    if k.arg == "name" and isinstance(k.value, ast.Constant)
                ]
                found[names[0] if names else function.replace("_", "-")] = function
    return found


def _annotation_parts(node: ast.expr | None) -> tuple[ast.expr | None, ast.Call | None]:
    """`Annotated[T, typer.Option(...)]` → (T, the Option call)."""
    if (
        isinstance(node, ast.Subscript)
        and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Annotated"
    ):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        call = next((e for e in elts[1:] if isinstance(e, ast.Call)), None)
        return elts[0], call
    return node, None


class TyperParameter(NamedTuple):
    """One parameter of a typer command: the flags that set it, and whether it is a bool (a switch)."""

    flags: frozenset[str]
    is_bool: bool


def typer_parameters(release: Release, module: str, function: str) -> dict[str, TyperParameter]:
    """parameter name → its flags and switch-ness, for one typer command function (defined once in `module`)."""
    fns = [n for n in tree(release, module).body if isinstance(n, ast.FunctionDef) and n.name == function]
    if len(fns) != 1:
        raise Missing(f"{function} is defined {len(fns)} times in {module}, not once")
    parameters: dict[str, TyperParameter] = {}
    for arg in fns[0].args.args:
        kind, call = _annotation_parts(arg.annotation)
        is_bool = isinstance(kind, ast.Name) and kind.id == "bool"
        declared = [
            a.value
            for a in (call.args if call else [])
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        ]
        flags: set[str] = set()
        for decl in declared:
            flags.update(decl.split("/"))
        if not flags:
            name = "--" + arg.arg.replace("_", "-")
            flags = {name, "--no-" + name[2:]} if is_bool else {name}
        parameters[arg.arg] = TyperParameter(frozenset(flags), is_bool)
    return parameters


def typer_options(release: Release, module: str, function: str) -> dict[str, str]:
    """flag → form of one typer command function's options (bool parameters are switches)."""
    return {
        flag: SWITCH if p.is_bool else VALUE
        for p in typer_parameters(release, module, function).values()
        for flag in p.flags
    }


# --- speculators: the trainer -------------------------------------------------------------------------------------

TRAIN_SCHEMA = "speculators.train.config.schema"


def _train_kind(annotation: ast.expr) -> str:
    node = annotation
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        none_left = isinstance(node.left, ast.Constant) and node.left.value is None
        node = node.right if none_left else node.left
    if isinstance(node, ast.Name) and node.id == "bool":
        return SWITCH
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "list":
        return VALUES
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return choices_form([str(e.value) for e in elts if isinstance(e, ast.Constant)])
    return VALUE


class TrainField(NamedTuple):
    """One field of `TrainConfig` or of one of its groups, as the trainer's parser turns it into a flag."""

    name: str
    form: str
    negatable: bool  # a switch with a `--no-` form (BooleanOptionalAction)


def train_fields(spec: Release) -> dict[str, TrainField]:
    """Every field of `TrainConfig` and of each group `_GROUPS` names (a group class the schema module does not
    define is a `Missing`: its flags would otherwise go unseen)."""
    schema = tree(spec, TRAIN_SCHEMA)
    classes = {n.name: n for n in schema.body if isinstance(n, ast.ClassDef)}
    groups: set[str] = set()
    for node in schema.body:
        is_groups = isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_GROUPS"
        if is_groups and isinstance(node.value, ast.Dict):
            groups = {v.id for v in node.value.values if isinstance(v, ast.Name)}
    found: dict[str, TrainField] = {}
    for name in ["TrainConfig", *sorted(groups)]:
        if name not in classes:
            raise Missing(f"{name} is not a class of {TRAIN_SCHEMA}")
        for stmt in classes[name].body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if getattr(stmt.annotation, "id", None) in groups or stmt.target.id.startswith("_"):
                continue  # a group attribute, or private state
            if not (isinstance(stmt.value, ast.Call) and getattr(stmt.value.func, "id", "") == "Field"):
                continue
            kw = {k.arg: k.value for k in stmt.value.keywords}
            default = kw["default"].value if isinstance(kw.get("default"), ast.Constant) else "<factory>"
            tagged = getattr(kw.get("json_schema_extra"), "id", "") == "_CLI_BOOL_OPTIONAL"
            form = _train_kind(stmt.annotation)
            negatable = form == SWITCH and (tagged or default is None or default is True)
            found[stmt.target.id] = TrainField(stmt.target.id, form, negatable)
    return found


def train_flags(spec: Release, hsc: Release | None) -> dict[str, str]:
    """flag → form of `python -m speculators.train`, from the fields of `TrainConfig` and its groups."""
    flags: dict[str, str] = {}
    try:
        fields = train_fields(spec)
    except Missing:
        if spec.has_module(TRAIN_SCHEMA):
            raise  # the schema is there but a group of it is not
        return flags
    for field in fields.values():
        flag = "--" + field.name.replace("_", "-")
        flags[flag] = field.form
        if field.negatable:
            flags["--no-" + flag[2:]] = SWITCH
    flags["--config"] = VALUE
    if hsc is not None:
        with contextlib.suppress(KeyError):
            transfer = hsc.source("hs_connectors.transfer")
            if '"--hidden-states-path"' in transfer:
                flags["--hidden-states-path"] = VALUE
    return flags


# --- SGLang -------------------------------------------------------------------------------------------------------


def _arg_meta(annotation: ast.expr) -> tuple[str, dict[str, ast.expr]] | None:
    """`A[T, "help"]` / `A[T, Arg(...)]` → (T as source, Arg keywords); None when the field has no CLI metadata."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", "") == "A"):
        return None
    elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    kind = ast.unparse(elts[0])
    for meta in elts[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return kind, {}
        if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            return kind, {k.arg: k.value for k in meta.keywords if k.arg}
    return None


def _annotated_flags(nodes, flags: dict[str, str]) -> None:
    """The flags `add_cli_args_from_dataclass` derives from annotated fields (`A[T, Arg(...)]`): `--field-name` or
    `Arg(cli_name=…)`, its `aliases`, none for `no_cli=True`; a bool without an `action` is a switch."""
    for node in nodes:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        meta = _arg_meta(node.annotation)
        if meta is None:
            continue
        kind, kw = meta
        if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value:
            continue
        cli_name = kw.get("cli_name")
        name = (
            cli_name.value if isinstance(cli_name, ast.Constant) else "--" + node.target.id.replace("_", "-")
        )
        aliases = [a.value for a in getattr(kw.get("aliases"), "elts", []) if isinstance(a, ast.Constant)]
        switch = kind in ("bool", "Optional[bool]") and "action" not in kw
        for flag in [name, *aliases]:
            flags[flag] = SWITCH if switch else VALUE


def sglang_launch_flags(release: Release) -> dict[str, str]:
    """Every `python -m sglang.launch_server` flag → its form (`switch` for a `store_true` flag). The annotated fields
    live in `sglang/srt/arg_groups/fields/` (0.5.23) or in the `ServerArgs` class itself (0.5.18); both are read."""
    flags: dict[str, str] = {}
    for module in _modules_below(release, "sglang.srt.arg_groups.fields"):
        _annotated_flags(ast.walk(tree(release, module)), flags)
    with contextlib.suppress(Missing):
        for node in tree(release, "sglang.srt.server_args").body:
            if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
                _annotated_flags(node.body, flags)
    with contextlib.suppress(Missing):
        for node in ast.walk(tree(release, "sglang.srt.server_args")):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for a in node.args:
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                        switch = any(k.arg == "action" for k in node.keywords)
                        flags[a.value] = SWITCH if switch else VALUE
    return flags
