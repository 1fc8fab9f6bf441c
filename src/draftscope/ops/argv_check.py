"""Every command line the kit's plans emit for an image, parsed by the engine's own parser inside that image.

The contract tier reads the pinned releases' sources without importing them; this check is the other half: in
the built image, with the very packages a run uses, each planned argv goes through the parser the engine itself
runs (vLLM's `vllm serve` parser and `EngineArgs`, speculators' trainer and its typer CLI, SGLang's
`ServerArgs`, the kit's own stage entries). Parse only: nothing is started and no GPU is needed, so it runs as a
build step (`python -m draftscope argv-check --image NAME`) and a renamed flag fails the build, not a user's first
run.

`planned(image)` is pure and torch-free (the host side, also what the tests mutate); `check(planned)` imports the
engines, lazily, per kind of command.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.core import presets as P
from draftscope.core.errors import UserError
from draftscope.core.images import IMAGES

# The images whose plans this check knows; vllm-cpu and transformers run the kit's own loops (no engine parser).
# sglang-cpu: the serve and bench stages on a CPU, parsed by its SGLang 0.5.18.
CHECKED_IMAGES = ("vllm", "train", "sglang", "sglang-cpu")
# A workdir that is never created: planning is pure, and the paths only appear inside the argv.
_WORKDIR = Path("/draftscope-argv-check")
# GPU generations the vLLM benchmark's engine arguments are built for (the dtype rule depends on it).
_CAPABILITIES = ((9, 0), (8, 0))


@dataclass(frozen=True)
class Planned:
    """One command the kit would run in an image: where it comes from, and its argv (or vLLM engine kwargs)."""

    where: str
    argv: tuple[str, ...] = ()
    engine_kwargs: dict[str, Any] | None = field(default=None, hash=False, compare=False)


# --- what the plans emit (host side, pure) ----------------------------------------------------------------------


def planned(image: str) -> list[Planned]:
    """Every argv the pipeline plans (each model preset × draft type, and the tiny CPU path) and the benchmark plans
    emit for `image`."""
    if image not in IMAGES:
        raise UserError(
            f"no image named '{image}'", field="--image", fix=f"choose one of: {', '.join(IMAGES)}"
        )
    if image not in CHECKED_IMAGES:
        raise UserError(
            f"the {image} image runs no engine command line of the kit's plans",
            field="--image",
            value=image,
            fix=f"choose one of: {', '.join(CHECKED_IMAGES)}",
        )
    found = list(_pipeline(image))
    if image == "vllm":
        found += list(_benchmarks())
    return list(dict.fromkeys(found))  # identical argv from several presets are parsed once


def _pipeline(image: str) -> Iterator[Planned]:
    from draftscope.pipeline import plan as planning  # the pipeline package: only this command needs it
    from draftscope.pipeline import registry
    from draftscope.pipeline.config import DRAFTS, load_pipeline_config

    variants = [(p, d, []) for p in P.model_preset_names() for d in DRAFTS]
    variants += [("tiny", d, ["device=cpu"]) for d in DRAFTS]  # the CPU path the tiny pipeline takes
    variants += [("tiny", "dflash", ["device=cpu", "serve.draft=model"])]  # what SGLang's CPU engine serves
    for preset, draft, opts in variants:
        resolved = load_pipeline_config(draft=draft, preset=preset, opts=opts)
        plan = planning.build(resolved, registry.select("all"), _WORKDIR, "docker")
        label = f"{preset} {draft}{' ' + ' '.join(opts) if opts else ''}"
        for stage in plan.stages:
            if stage.step.image != image:  # the image the step runs in (on a CPU: a stage's cpu_image)
                continue
            yield Planned(f"pipeline {label}: {stage.stage.name}", tuple(stage.step.argv))
            for command in stage.commands:
                yield Planned(f"pipeline {label}: {stage.stage.name} {command.name}", tuple(command.argv))


def _benchmarks() -> Iterator[Planned]:
    from draftscope.bench import backends  # the backends' specs: which image each runs in
    from draftscope.bench.backends.vllm import config as vllm_config  # the vLLM backend's pure half

    for name in P.experiment_preset_names():
        config = P.load_experiment(name)
        if backends.get(config.backend).image != "vllm":
            continue
        preset = P.load_model_preset(config.model_preset)
        capabilities = _CAPABILITIES if config.device == "cuda" else (None,)
        for capability in capabilities:
            kwargs = vllm_config.engine_args(
                config, preset, capability=capability, require_pins=False, models=vllm_config.PLACEHOLDERS
            )
            where = f"benchmark {name}" + (f" sm_{capability[0]}{capability[1]}" if capability else "")
            yield Planned(where, engine_kwargs=kwargs)


# --- which parser reads an argv --------------------------------------------------------------------------------

_PYTHONS = ("python", "python3")


def classify(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(kind, the arguments that kind's parser reads). An argv no parser is known for is a UserError: a plan that
    starts something new must teach this check to parse it."""
    argv = list(argv)
    if argv[:1] == ["vllm"] and argv[1:2] == ["serve"]:
        return "vllm-serve", argv[2:]
    if argv[:1] == ["torchrun"] and "-m" in argv:
        at = argv.index("-m")
        argv = ["python", *argv[at:]]
    if argv[:1] and argv[0] in _PYTHONS and argv[1:2] == ["-m"] and len(argv) > 2:
        module, rest = argv[2], argv[3:]
        if module in ("vllm.entrypoints.cli.main",) and rest[:1] == ["serve"]:
            return "vllm-serve", rest[1:]
        if module in ("speculators.train", "draftscope.pipeline.stages.train.cpu_train"):
            return "speculators-train", rest
        if module == "speculators":
            return "speculators-cli", rest
        if module == "sglang.launch_server":
            return "sglang-server", rest
        if module == "draftscope.pipeline":
            if rest[:1] == ["exec"] and "--" in rest:
                return classify(rest[rest.index("--") + 1 :])
            return "kit-pipeline", rest
    raise UserError(
        "no parser is known for this planned command",
        field="argv",
        value=" ".join(argv[:6]),
        fix="teach draftscope.ops.argv_check.classify which engine parser reads it",
    )


# --- the engines' own parsers (inside the image) ---------------------------------------------------------------


class ParseFailed(Exception):
    """An engine's parser refused a planned argv; the message is what it said."""


@contextlib.contextmanager
def _captured() -> Iterator[io.StringIO]:
    """Parsers print their usage errors and exit(2): keep what they said for the report."""
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            yield out
        except SystemExit as exc:
            if exc.code not in (0, None):
                said = out.getvalue().strip().splitlines()
                raise ParseFailed(said[-1] if said else f"exit {exc.code}") from None


def _vllm_cpu_platform() -> None:
    """vLLM computes parser defaults from the current platform, and without a GPU (a build) it cannot infer one:
    pin vLLM's own CPU platform class first. `current_platform` is set through the module's `__setattr__` (a
    contract test pins it), so a release that moves it fails loudly here."""
    import vllm.platforms as platforms  # lazy: the engine, inside its image
    from vllm.platforms.cpu import CpuPlatform

    if platforms._current_platform is None:
        platforms.current_platform = CpuPlatform()
    # The images set HF_HUB_OFFLINE=1, and with it `EngineArgs` maps a hub id to its local snapshot as it is
    # constructed, which fails where no snapshot is mounted (a build). Resolving the model is not parsing: off for
    # this process only (nothing here fetches anything either way).
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = False


def parse_vllm_serve(args: list[str]) -> None:
    _vllm_cpu_platform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    with _captured():
        namespace = parser.parse_args(args)
    if namespace.model_tag is not None:
        namespace.model = namespace.model_tag
    try:
        validate_parsed_serve_args(namespace)
        AsyncEngineArgs.from_cli_args(namespace)
    except (TypeError, ValueError) as exc:
        raise ParseFailed(f"{type(exc).__name__}: {exc}") from None


def parse_vllm_engine_kwargs(kwargs: dict[str, Any]) -> None:
    _vllm_cpu_platform()
    from vllm.engine.arg_utils import EngineArgs

    try:
        EngineArgs(**kwargs)
    except TypeError as exc:
        raise ParseFailed(f"TypeError: {exc}") from None


def parse_speculators_train(args: list[str]) -> None:
    from speculators.train.config.resolution import build_parser  # lazy: the train image's speculators

    with _captured():
        build_parser().parse_args(args)


def parse_speculators_cli(args: list[str]) -> None:
    """speculators' typer app, resolved to the subcommand's click command and parsed (`make_context`) without
    invoking it. A parameter whose path does not exist is not an error here: the run directory is not there at
    build time; every other refusal (an unknown option, a bad choice, a missing value) is."""
    import typer.main  # lazy: speculators' CLI framework, in the train image
    from speculators.cli import app

    try:  # typer 0.2x carries its own copy of click: its exceptions are not click's
        from typer._click import exceptions as errors
    except ImportError:  # pragma: no cover - a typer on the public click
        from click import exceptions as errors

    group = typer.main.get_command(app)
    if not args:
        raise ParseFailed("no subcommand")
    command = group.get_command(group.context_class(group), args[0])
    if command is None:
        raise ParseFailed(f"no speculators subcommand '{args[0]}'")
    try:
        with _captured():
            command.make_context(args[0], list(args[1:]))
    except errors.BadParameter as exc:
        if "does not exist" not in str(exc.message):
            raise ParseFailed(exc.format_message()) from None
    except errors.ClickException as exc:
        raise ParseFailed(exc.format_message()) from None


def parse_sglang_server(args: list[str]) -> None:
    import argparse

    from sglang.srt.server_args import ServerArgs  # lazy: the sglang image

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    with _captured():
        parser.parse_args(args)


def sglang_draft_config(draft: str, algorithm: str) -> dict[str, Any]:
    """What SGLang makes of a converted draft without a GPU: its `ModelConfig` for the draft (as the speculative
    worker builds it) and the model class its registry resolves the architecture to. The facts the convert stage
    must get right (architecture, layer ids, block size, mask token, anchor rule) are returned as SGLang read them."""
    from sglang.srt.configs.model_config import ModelConfig  # lazy: the sglang image
    from sglang.srt.models.registry import ModelRegistry

    try:
        config = ModelConfig(
            draft,
            trust_remote_code=False,
            is_draft_model=True,
            speculative_algorithm=algorithm,
            dtype="bfloat16",
        )
        cls, arch = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
    except (ValueError, OSError, KeyError) as exc:
        raise UserError(f"SGLang cannot read the draft: {exc}", field="--draft", value=draft) from None
    dflash = getattr(config.hf_config, "dflash_config", None) or {}
    return {
        "architecture": arch,
        "model_class": f"{cls.__module__}.{cls.__name__}",
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "context_length": config.context_len,
        "dflash_config": {
            key: dflash.get(key)
            for key in (
                "target_layer_ids",
                "num_target_layers",
                "block_size",
                "mask_token_id",
                "sample_from_anchor",
            )
        },
    }


def parse_kit_pipeline(args: list[str]) -> None:
    from draftscope.pipeline.__main__ import parser

    with _captured():
        parser().parse_args(args)


PARSERS: dict[str, Callable[[list[str]], None]] = {
    "vllm-serve": parse_vllm_serve,
    "speculators-train": parse_speculators_train,
    "speculators-cli": parse_speculators_cli,
    "sglang-server": parse_sglang_server,
    "kit-pipeline": parse_kit_pipeline,
}


@dataclass(frozen=True)
class Outcome:
    where: str
    kind: str
    error: str | None


def check(commands: Sequence[Planned]) -> list[Outcome]:
    """Parse each planned command with its engine's parser; one outcome per command, the error text when refused."""
    outcomes = []
    for item in commands:
        kind, args = ("vllm-engine-args", []) if item.engine_kwargs is not None else classify(item.argv)
        try:
            if item.engine_kwargs is not None:
                parse_vllm_engine_kwargs(dict(item.engine_kwargs))
            else:
                PARSERS[kind](args)
            outcomes.append(Outcome(item.where, kind, None))
        except ParseFailed as exc:
            outcomes.append(Outcome(item.where, kind, str(exc)))
    return outcomes


def to_json(commands: Sequence[Planned]) -> list[dict[str, Any]]:
    """The planned commands as JSON (`--commands`): a host plans, the image parses."""
    return [
        {"where": c.where, "engine_kwargs": c.engine_kwargs}
        if c.engine_kwargs is not None
        else {"where": c.where, "argv": list(c.argv)}
        for c in commands
    ]


def from_json(data: Any, source: str) -> list[Planned]:
    """The `--commands` file back: a list of {where, argv: [str…]} or {where, engine_kwargs: {…}}."""
    if not isinstance(data, list):
        raise UserError(
            "not a list of planned commands", field=source, fix="write it with argv_check.to_json"
        )
    out = []
    for i, item in enumerate(data):
        where = f"{source}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("where"), str):
            raise UserError("not an object with a string 'where'", field=where, fix="see argv_check.to_json")
        if set(item) == {"where", "argv"} and isinstance(item["argv"], list):
            if not item["argv"] or not all(isinstance(a, str) for a in item["argv"]):
                raise UserError("argv is not a non-empty list of strings", field=f"{where}.argv")
            out.append(Planned(item["where"], tuple(item["argv"])))
        elif set(item) == {"where", "engine_kwargs"} and isinstance(item["engine_kwargs"], dict):
            out.append(Planned(item["where"], engine_kwargs=dict(item["engine_kwargs"])))
        else:
            raise UserError(
                "a planned command has exactly 'where' and one of 'argv' (a list) or 'engine_kwargs' (an object)",
                field=where,
                value=sorted(item),
            )
    return out


def main(image: str, commands: str | None = None) -> int:
    """`python -m draftscope argv-check --image NAME [--commands FILE]`: parse the image's planned commands (or
    those of FILE, as `to_json` writes them), print one line per kind and every refusal; exit 1 when any command
    was refused."""
    if commands is None:
        items = planned(image)
    else:
        from draftscope.core.reading import read_json

        items = from_json(read_json(Path(commands)), "--commands")
    outcomes = check(items)
    kinds: dict[str, int] = {}
    for o in outcomes:
        if not o.error:
            kinds[o.kind] = kinds.get(o.kind, 0) + 1
    failed = [o for o in outcomes if o.error]
    for kind, count in sorted(kinds.items()):
        print(f"{image}: {count} {kind} command(s) parsed by the engine's own parser")
    for o in failed:  # tab-separated: a label or a parser's message may hold any other character
        print(f"REFUSED\t{o.where}\t{o.kind}\t{o.error}")
    print(f"{image}: {len(outcomes) - len(failed)} of {len(outcomes)} planned commands parse")
    return 1 if failed else 0
