"""The kit's surface on each upstream package: every flag, config field, metric name, Literal value and symbol the
kit uses, with the kit features that use it.

Nothing here is a hand-kept list of upstream names: each item comes from the kit itself — the argv the pipeline
plans for every model preset × draft type, the engine arguments the vLLM backend builds for its presets, and the
constants in which the backend and the convert stage declare the names they read. What is written here is *where*
upstream defines each kind of name (the module and class to look in), the same places the contract tier reads.
An item's `lookup` says how to find it in a release (`forms.form_of`).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope import head
from draftscope.bench.backends.vllm import backend as V
from draftscope.bench.backends.vllm import config as C
from draftscope.core import presets as P
from draftscope.core.errors import UserError
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.pipeline.stages.convert import checkpoint as K

KINDS = ("flag", "config-field", "metric", "literal", "symbol")
Lookup = tuple[str, ...]


@dataclass(frozen=True)
class Item:
    """One upstream name the kit uses: its kind, how it is shown, how to find it, and the features using it."""

    kind: str
    name: str
    lookup: Lookup
    features: tuple[str, ...]


def merged(items: Iterable[Item]) -> list[Item]:
    """One item per (kind, name, lookup), its features the union, in first-seen order."""
    out: dict[tuple[str, str, Lookup], list[str]] = {}
    for item in items:
        features = out.setdefault((item.kind, item.name, item.lookup), [])
        features += [f for f in item.features if f not in features]
    return [Item(kind, name, lookup, tuple(f)) for (kind, name, lookup), f in out.items()]


def split_options(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(--flag, values…)] in order; words before the first flag (a command, a positional) are skipped. A bare
    `--` counts as a flag: no upstream parser here takes one, so it is reported rather than read as a value."""
    out: list[tuple[str, list[str]]] = []
    for word in argv:
        if word.startswith("--"):
            out.append((word, []))
        elif out:
            out[-1][1].append(word)
    return out


# --- the pipeline's planned commands -------------------------------------------------------------------------------

WORKDIR = Path("/tmp/draftscope-contracts")  # planning only; nothing is written there


def _upstream(argv: list[str]) -> list[str]:
    """The upstream command of a step run through `python -m draftscope.pipeline exec … -- CMD`."""
    if argv[:4] == ["python", "-m", "draftscope.pipeline", "exec"] and "--" in argv:
        return argv[argv.index("--") + 1 :]
    return argv


def planned(stages: str) -> Iterator[tuple[str, str, str, str, list[str]]]:
    """(preset, draft, stage, command name, argv) for every model preset × draft type (docker), and the tiny
    preset's CPU path (local runtime)."""
    for preset in P.model_preset_names():
        for draft in DRAFTS:
            yield from _plan(
                load_pipeline_config(draft=draft, preset=preset), stages, "docker", preset, draft
            )
    for draft in DRAFTS:
        resolved = load_pipeline_config(draft=draft, preset="tiny", opts=["device=cpu"])
        yield from _plan(resolved, stages, "local", "tiny", draft)
    if "regen" in stages.split(","):
        # the tiny preset with regen.server=vllm: vLLM's own server on the CPU backend
        resolved = load_pipeline_config(preset="tiny", opts=["regen.server=vllm"])
        yield from _plan(resolved, "regen", "local", "tiny", "regen.server=vllm")


def _plan(resolved: Any, stages: str, runtime: str, preset: str, draft: str) -> Iterator[tuple[str, ...]]:
    plan = planning.build(resolved, registry.select(stages), WORKDIR, runtime)
    for sp in plan.stages:
        yield preset, draft, sp.stage.name, "step", _upstream(list(sp.step.argv))
        for command in sp.commands:
            yield preset, draft, sp.stage.name, command.name, _upstream(list(command.argv))


# --- vLLM ----------------------------------------------------------------------------------------------------------

BENCH = "benchmark --backend vllm"
LITERAL_ENGINE_ARGS = ("dtype", "distributed_executor_backend", "per_request_spec_decode_metrics")
SPECULATIVE = ("vllm.config.speculative", "SpeculativeConfig")


def _backend_configs() -> Iterator[tuple[str, P.ExperimentConfig]]:
    """(feature, config) covering every key `engine_args` can emit: the INT4 + DFlash2 preset, every hub model
    preset plain, and the CPU engine plain and with the tiny draft."""
    yield f"{BENCH} --int4-dflash", P.load_experiment("vllm-int4-dflash2")
    for model in P.model_preset_names():
        if P.load_model_preset(model).source == "hub":
            yield BENCH, P.load_experiment("vllm-int4-dflash2", {"model_preset": model, "int4_dflash": False})
    cpu = f"{BENCH} --device cpu"
    yield cpu, P.load_experiment(C.CPU_EXPERIMENT)
    tiny_draft = {"draft": "tiny", "dtype": "bfloat16", "experimental_prefix": True}
    yield cpu, P.load_experiment(C.CPU_EXPERIMENT, tiny_draft)


def engine_arg_sets() -> Iterator[tuple[str, dict[str, Any]]]:
    for feature, config in _backend_configs():
        preset = P.load_model_preset(config.model_preset)
        for capability in ((9, 0), (7, 5)) if config.device == "cuda" else (None,):
            with contextlib.suppress(UserError):  # a preset the backend refuses has no engine arguments
                yield (
                    feature,
                    C.engine_args(
                        config, preset, capability=capability, require_pins=False, models=C.PLACEHOLDERS
                    ),
                )


def _literal(cls: tuple[str, str], field: str, value: str, features: tuple[str, ...]) -> Item:
    return Item("literal", f"{cls[1]}.{field} = {value!r}", ("literal", *cls, field, value), features)


def _field(cls: tuple[str, str], field: str, features: tuple[str, ...], kind: str = "config-field") -> Item:
    return Item(kind, f"{cls[1]}.{field}", ("field", *cls, field), features)


def vllm_items() -> list[Item]:
    items: list[Item] = []
    engine = ("vllm", "EngineArgs")
    for feature, args in engine_arg_sets():
        features = (feature,)
        for key, value in args.items():
            items.append(_field(engine, key, features))
            if key in LITERAL_ENGINE_ARGS and isinstance(value, str):
                items.append(_literal(engine, key, value, features))
        for key, value in (args.get("speculative_config") or {}).items():
            items.append(_field(SPECULATIVE, key, features))
            if key == "method":
                items.append(_literal(SPECULATIVE, key, value, features))
    bench = (BENCH,)
    for key in [*C.sampling_kwargs(8, ignore_eos=True), "output_kind"]:
        items.append(_field(("vllm", "SamplingParams"), key, bench))
    items += [_field(("vllm", "TokensPrompt"), key, bench) for key in V.TOKENS_PROMPT_KEYS]
    items += [Item("symbol", f"{m}.{n}", ("symbol", m, n), bench) for n, m in V.SYMBOLS.items()]
    declared = [
        (("vllm", "LLMEngine"), V.ENGINE_METHODS, "method"),
        (("vllm.outputs", "RequestOutput"), V.REQUEST_OUTPUT_ATTRS, "init-attr"),
        (("vllm.outputs", "CompletionOutput"), V.COMPLETION_ATTRS, "field"),
        (("vllm.v1.metrics.stats", "RequestSpecDecodeMetrics"), V.SPEC_METRICS_ATTRS, "field"),
        (("vllm.v1.metrics.reader", "Counter"), V.METRIC_ATTRS, "field"),
        (("vllm.platforms.interface", "Platform"), V.PLATFORM_METHODS, "method"),
        (("vllm.platforms.interface", "DeviceCapability"), V.CAPABILITY_ATTRS, "field"),
        (("vllm.tokenizers.protocol", "TokenizerLike"), V.TOKENIZER_METHODS, "method"),
        (("vllm.sampling_params", "RequestOutputKind"), (V.OUTPUT_KIND,), "member"),
    ]
    for (module, name), attrs, how in declared:
        items += [Item("symbol", f"{name}.{a}", (how, module, name, a), bench) for a in attrs]
    items += [
        Item(
            "symbol", f"LLMEngine.add_request({p}=)", ("param", "vllm", "LLMEngine", "add_request", p), bench
        )
        for p in V.ADD_REQUEST_PARAMS
    ]
    items += [
        Item(
            "literal",
            f"FINISH_REASON_STRINGS {r!r}",
            ("listed", "vllm.v1.engine", "FINISH_REASON_STRINGS", r),
            bench,
        )
        for r in (V.FINISH_STOP, V.FINISH_LENGTH)
    ]
    items += [Item("metric", m, ("string", "vllm.v1.spec_decode.metrics", m), bench) for m in V.SPEC_COUNTERS]
    items += _vllm_server_flags()
    items += _prefix_plugin_items()
    return merged(items)


def _is_vllm_server(argv: list[str]) -> bool:
    return bool(argv) and (
        argv[0] == "vllm"
        or (argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("vllm."))
        or (len(argv) > 1 and argv[1].endswith("launch_vllm.py"))
    )


def _vllm_server_flags() -> list[Item]:
    """`vllm serve` flags of the regen and hsextract servers (after `--` for speculators' launch_vllm.py)."""
    items = []
    for _, _, stage, name, argv in planned("regen,hsextract"):
        if not name.startswith("server") or not _is_vllm_server(argv):
            continue
        args = argv[argv.index("--") + 1 :] if "--" in argv else argv
        for flag, _ in split_options(args):
            items.append(Item("flag", f"vllm serve {flag}", ("serve-flag", flag), (f"{stage} server",)))
    return items


PREFIX = "benchmark --experimental-prefix"
# The prefix-head plugin imports torch, so its declarations are read from its source, not imported.
PLUGIN_SOURCE = Path(head.__file__).with_name("vllm_plugin.py")
PLUGIN_CONSTANTS = (
    "SYMBOLS",
    "RUNNER_HOOKS",
    "PROCESSOR_FORWARD",
    "DENSE_HEAD_METHODS",
    "SAMPLER_CLASSES",
    "STANDARD_REJECTION",
    "ATTRS",
    "UVA_ATTRS",
)
LOGITS = ("vllm.model_executor.layers.logits_processor", "LogitsProcessor")
RUNNER = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
# The class each kind of object in the plugin's ATTRS is (the plugin names its variables after these kinds).
ATTR_CLASSES = {
    "processor": LOGITS,
    "lm_head": ("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding"),
    "vllm_config": ("vllm.config.vllm", "VllmConfig"),
    "runner": RUNNER,
    "model_state": ("vllm.v1.worker.gpu.model_states.interface", "ModelState"),
    "spec": SPECULATIVE,
    "sampler": ("vllm.v1.worker.gpu.sample.sampler", "Sampler"),
    "states": ("vllm.v1.worker.gpu.sample.states", "SamplingStates"),
    "token_ids_state": ("vllm.v1.worker.gpu.sample.logprob", "LogprobTokenIdsState"),
    "batch": ("vllm.v1.worker.gpu.input_batch", "InputBatch"),
    "grammar": ("vllm.v1.core.sched.output", "GrammarOutput"),
    "uva": ("vllm.v1.worker.gpu.buffer_utils", "UvaBackedTensor"),
}


def declared_constants(path: Path, names: Iterable[str]) -> dict[str, Any]:
    """Module-level constants of a kit source file, by name, read with `ast.literal_eval` (never imported)."""
    wanted, found = set(names), {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id in wanted and node.value is not None:
            with contextlib.suppress(ValueError):
                found[target.id] = ast.literal_eval(node.value)
    return found


def _prefix_plugin_items() -> list[Item]:
    plugin = declared_constants(PLUGIN_SOURCE, PLUGIN_CONSTANTS)
    feature = (PREFIX,)
    items = [
        Item("symbol", f"{m}.{n}", ("symbol", m, n), feature) for n, m in plugin.get("SYMBOLS", {}).items()
    ]
    for table in ("DENSE_HEAD_METHODS", "SAMPLER_CLASSES"):
        items += [
            Item("symbol", f"{m}.{n}", ("symbol", m, n), feature) for n, m in plugin.get(table, {}).items()
        ]
    hooks = dict(plugin.get("RUNNER_HOOKS", {}))
    signatures = [(RUNNER, name, params) for name, params in hooks.items()]
    if "PROCESSOR_FORWARD" in plugin:
        signatures.append((LOGITS, "forward", plugin["PROCESSOR_FORWARD"]))
    for (module, cls), method, _ in signatures:
        items.append(Item("symbol", f"{cls}.{method}()", ("signature", module, cls, method), feature))
    attrs = dict(plugin.get("ATTRS", {}))
    attrs["uva"] = plugin.get("UVA_ATTRS", ())
    for kind, names in attrs.items():
        if kind in ATTR_CLASSES:
            module, cls = ATTR_CLASSES[kind]
            items += [Item("symbol", f"{cls}.{a}", ("class-attr", module, cls, a), feature) for a in names]
    if "STANDARD_REJECTION" in plugin:
        items.append(_literal(SPECULATIVE, "rejection_sample_method", plugin["STANDARD_REJECTION"], feature))
    return items


# --- speculators ---------------------------------------------------------------------------------------------------

TRAIN_MODULE = "speculators.train"
CPU_TRAIN_MODULE = "draftscope.pipeline.stages.train.cpu_train"  # the kit's device shim, speculators' flags


def speculators_items() -> list[Item]:
    items: list[Item] = []
    for _, draft, stage, _, argv in planned("prepare,hsextract,train"):
        if argv[:3] == ["python", "-m", "speculators"] and len(argv) > 3:
            command = argv[3]
            feature = (stage,)
            items.append(Item("symbol", f"speculators {command}", ("typer-command", command), feature))
            items.append(Item("symbol", "speculators.__main__", ("module", "speculators.__main__"), feature))
            for flag, _ in split_options(argv[4:]):
                items.append(Item("flag", f"{command} {flag}", ("typer-option", command, flag), feature))
        for module in (TRAIN_MODULE, CPU_TRAIN_MODULE):
            if module in argv:
                items += _train_items(draft, argv[argv.index(module) + 1 :], module == TRAIN_MODULE)
    for draft in DRAFTS:
        items += _checkpoint_items(draft)
    return merged(items)


def _train_items(draft: str, args: list[str], as_module: bool) -> list[Item]:
    feature = (f"train {draft}",)
    items = [Item("symbol", f"speculator type {draft!r}", ("speculator-type", draft), feature)]
    if as_module:
        items.append(
            Item("symbol", "speculators.train.__main__", ("module", "speculators.train.__main__"), feature)
        )
    for flag, values in split_options(args):
        items.append(Item("flag", f"speculators.train {flag}", ("train-flag", flag), feature))
        if len(values) == 1:
            lookup = ("train-choice", flag, values[0])
            items.append(Item("literal", f"speculators.train {flag} {values[0]}", lookup, feature))
    return items


def _checkpoint_items(draft: str) -> list[Item]:
    """The config fields convert reads from a speculators checkpoint (DFlash's base class and the draft's own)."""
    keys = [*K.SPECULATORS_KEYS, *K.DFLASH_CONFIG_KEYS]
    keys += {
        "dflash": [],
        "dflash2": list(K.DFLASH2_KEYS),
        "dspark": [*K.DSPARK_KEYS, *K.DSPARK_TOP_LEVEL_KEYS],
    }[draft]
    lookup = ("speculators.models.dflash.config", f"speculators.models.{draft}.config")
    name = f"{draft} config"
    return [
        Item("config-field", f"{name}.{k}", ("annotated", *lookup, k), (f"convert {draft}",)) for k in keys
    ]


# --- SGLang --------------------------------------------------------------------------------------------------------

DFLASH_UTILS = "sglang.srt.speculative.dflash_utils"
DSPARK_CONFIG = "sglang.srt.speculative.dspark_components.dspark_config"


def sglang_items() -> list[Item]:
    items: list[Item] = []
    for _, _, stage, name, argv in planned("serve,bench"):
        if name == "step" or argv[:3] != ["python", "-m", "sglang.launch_server"]:
            continue
        for flag, _ in split_options(argv[3:]):
            items.append(Item("flag", f"launch_server {flag}", ("launch-flag", flag), (stage,)))
    for draft in DRAFTS:
        feature = (f"convert {draft}", "serve")
        arch = K.ARCHITECTURES[draft]
        items.append(
            Item("symbol", f"model class {arch}", ("entry-class", "sglang.srt.models", arch), feature)
        )
        if draft == "dspark":
            module, keys = DSPARK_CONFIG, [*K.DSPARK_KEYS, "sample_from_anchor", "mask_token_id"]
        else:
            module, keys = (
                DFLASH_UTILS,
                [*K.DFLASH_CONFIG_KEYS, *(K.DFLASH2_KEYS if draft == "dflash2" else ())],
            )
        for key in keys:
            items.append(
                Item("config-field", f"draft config {key}", ("string", module, key), (f"convert {draft}",))
            )
    return merged(items)
