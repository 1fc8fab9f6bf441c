"""Contract: every vLLM name the prefix-head plugin touches exists, with the shape it assumes, in the pinned release.

The release's wheel (0.33.0, `bench.backends.vllm.PINNED_VERSION`) is read with `ast`, never imported. Checked:
the plugin group vLLM loads in its worker processes; `LogitsProcessor` (a `PluggableLayer`) with its `forward` /
`_get_logits` signatures and the attributes the plugin reads; `register_oot` and the `__new__` redirect that makes
the replacement effective; the V2 runner's class, the three methods wrapped and the head calls inside them; the
input batch, sampler, sampling states and grammar output fields used for the row → request map, the draft tokens
and eligibility; and the greedy sampling code that turns argmax-equivalent logits into exactly the certified
token. The names come from the plugin's own declarations (`vllm_plugin.SYMBOLS`, `ATTRS`, …), so a rename on
either side fails here; the unit tests drive the plugin against fakes carrying exactly those declarations.
"""

from __future__ import annotations

import ast
import inspect
import tomllib
from pathlib import Path

import pytest
from releases import Release, pinned_release

from draftscope.bench.backends.vllm import backend as V
from draftscope.ops.contracts.reading import self_attributes

vllm_plugin = pytest.importorskip("draftscope.head.vllm_plugin")  # needs torch (not vLLM)

pytestmark = pytest.mark.contract

PLATFORM = (
    "manylinux_2_28_x86_64"  # the wheel the vllm image installs; its Python sources are every platform's
)
ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = [Path(vllm_plugin.__file__), Path(vllm_plugin.serving.__file__)]

RUNNER = "vllm.v1.worker.gpu.model_runner"
SAMPLER = "vllm.v1.worker.gpu.sample.sampler"
STATES = "vllm.v1.worker.gpu.sample.states"
REJECTION = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
REJECTION_UTILS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
LOGITS = "vllm.model_executor.layers.logits_processor"
CUSTOM_OP = "vllm.model_executor.custom_op"
EMBEDDING = "vllm.model_executor.layers.vocab_parallel_embedding"


@pytest.fixture(scope="module")
def vllm() -> Release:
    return pinned_release("vllm", V.PINNED_VERSION, platform=PLATFORM)


# --- reading the release ----------------------------------------------------------------------------------------


def top(release: Release, module: str, name: str) -> ast.AST:
    """A module-level definition (class, function, assignment) by name, under `if`/`try` blocks too."""
    stack = list(release.tree(module).body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            stack[:0] = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                stack[:0] = handler.body
            continue
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return node
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node
    raise AssertionError(f"{module}.{name} is not defined in vLLM {V.PINNED_VERSION}")


def klass(release: Release, module: str, name: str) -> ast.ClassDef:
    node = top(release, module, name)
    assert isinstance(node, ast.ClassDef), f"{module}.{name} is not a class"
    return node


def method(release: Release, module: str, cls: str, name: str) -> ast.FunctionDef:
    for node in klass(release, module, cls).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{module}.{cls}.{name} does not exist in vLLM {V.PINNED_VERSION}")


def params(fn: ast.FunctionDef) -> tuple[str, ...]:
    return tuple(a.arg for a in [*fn.args.posonlyargs, *fn.args.args])


def class_fields(release: Release, module: str, cls: str) -> dict[str, ast.AnnAssign]:
    return {
        s.target.id: s
        for s in klass(release, module, cls).body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }


def source(node: ast.AST) -> str:
    return ast.unparse(node)


# --- the release and the entry point ----------------------------------------------------------------------------


def test_the_wheel_is_the_pinned_release(vllm):
    assert vllm.metadata("Version") == V.PINNED_VERSION == vllm_plugin.PINNED_VERSION


def test_vllm_loads_the_general_plugins_group_in_its_worker_processes(vllm):
    group = top(vllm, "vllm.plugins", "DEFAULT_PLUGINS_GROUP")
    assert ast.literal_eval(group.value) == vllm_plugin.ENTRY_POINT_GROUP
    loader = source(top(vllm, "vllm.plugins", "load_general_plugins"))
    assert "load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP)" in loader
    assert (
        "for func in plugins.values():\n        func()" in loader
    )  # each entry point is called, no arguments
    # The worker (where the model is built) loads plugins before it constructs the worker and its model.
    init_worker = source(method(vllm, "vllm.v1.worker.worker_base", "WorkerWrapperBase", "init_worker"))
    assert init_worker.index("load_general_plugins()") < init_worker.index("worker_class")
    # A failing entry point stops vLLM (the loader catches only import errors): register() must not fail quietly.
    assert "try:\n                func = plugin.load()" in source(
        top(vllm, "vllm.plugins", "load_plugins_by_group")
    )


def test_the_entry_point_is_the_registration_function():
    module, _, attr = vllm_plugin.ENTRY_POINT.partition(":")
    assert module == vllm_plugin.__name__ and attr == "register"
    assert not inspect.signature(vllm_plugin.register).parameters  # vLLM calls it with no arguments


def test_pyproject_declares_the_entry_point():
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})
    group = entry_points.get(vllm_plugin.ENTRY_POINT_GROUP)
    if group is None:
        pytest.skip(f'pyproject.toml has no [project.entry-points."{vllm_plugin.ENTRY_POINT_GROUP}"] yet')
    assert group.get(vllm_plugin.ENTRY_POINT_NAME) == vllm_plugin.ENTRY_POINT, group


def test_every_symbol_exists_where_the_plugin_imports_it(vllm):
    for name, module in vllm_plugin.SYMBOLS.items():
        if name == "get_current_vllm_config":  # re-exported by vllm.config from vllm.config.vllm
            assert name in source(top(vllm, "vllm.config", "__all__"))
            module = "vllm.config.vllm"
        top(vllm, module, name)
    assert ast.literal_eval(top(vllm, STATES, "NO_LOGPROBS").value) == -1
    assert isinstance(top(vllm, CUSTOM_OP, "op_registry_oot"), ast.AnnAssign)


# --- the replaced layer -----------------------------------------------------------------------------------------


def test_logits_processor_is_a_pluggable_layer_with_the_assumed_signatures(vllm):
    node = klass(vllm, LOGITS, "LogitsProcessor")
    assert [source(b) for b in node.bases] == ["PluggableLayer"]
    assert "PluggableLayer.register('logits_processor')" in [source(d) for d in node.decorator_list]
    forward = method(vllm, LOGITS, "LogitsProcessor", "forward")
    assert params(forward) == vllm_plugin.PROCESSOR_FORWARD
    assert [source(d) for d in forward.args.defaults] == ["None", "False"]
    get_logits = method(vllm, LOGITS, "LogitsProcessor", "_get_logits")
    assert params(get_logits) == ("self", "hidden_states", "lm_head", "embedding_bias", "skip_gather")
    body = source(forward)
    assert "self._get_logits(hidden_states, lm_head, embedding_bias, skip_gather)" in body
    assert "self.soft_cap" in body and "self.scale" in body  # why soft cap and scale are prerequisites
    assert set(vllm_plugin.ATTRS["processor"]) <= self_attributes(
        method(vllm, LOGITS, "LogitsProcessor", "__init__")
    )
    # The dense head: the lm_head's quant method, then the trim to the original vocabulary.
    assert "lm_head.quant_method.apply(lm_head, hidden_states, bias=embedding_bias)" in source(
        method(vllm, LOGITS, "LogitsProcessor", "_apply_head")
    )
    assert "logits[..., :self.org_vocab_size]" in source(get_logits)


def test_register_oot_replaces_every_later_instantiation(vllm):
    register_oot = method(vllm, CUSTOM_OP, "PluggableLayer", "register_oot")
    assert params(register_oot) == ("cls", "_decorated_layer_cls", "name")
    assert "classmethod" in [source(d) for d in register_oot.decorator_list]
    text = source(register_oot)
    assert (
        "reg_name = name if name is not None else cls.__name__" in text
    )  # LogitsProcessor.register_oot → its name
    assert "op_registry_oot[reg_name] = layer_cls" in text
    assert "assert reg_name not in op_registry_oot" in text  # why register() checks the registry first
    new = source(method(vllm, CUSTOM_OP, "PluggableLayer", "__new__"))
    assert "layer_class_name = cls.__name__" in new and "op_registry_oot[layer_class_name]" in new
    # CustomOp has the same mechanism; LogitsProcessor is a PluggableLayer, so the plugin uses the latter's.
    method(vllm, CUSTOM_OP, "CustomOp", "register_oot")
    assert vllm_plugin.OOT_NAME == "LogitsProcessor"


def test_the_head_layer_attributes_and_dense_methods(vllm):
    embedding = klass(vllm, EMBEDDING, "VocabParallelEmbedding")
    assert {"tp_size", "quant_method"} <= self_attributes(embedding)
    assert "weight" in vllm_plugin.ATTRS["lm_head"]
    create = source(method(vllm, EMBEDDING, "UnquantizedEmbeddingMethod", "create_weights"))
    assert "layer.register_parameter('weight', weight)" in create
    for name, module in vllm_plugin.DENSE_HEAD_METHODS.items():
        apply = source(method(vllm, module, name, "apply"))
        assert "layer.weight, bias)" in apply, name  # a plain GEMM on the layer's own weight
    assert "torch.nn.functional.linear(x, weight, bias)" in source(
        top(vllm, "vllm.model_executor.layers.utils", "default_unquantized_gemm")
    )


# --- the runner and the step's metadata -------------------------------------------------------------------------


def test_the_v2_runner_is_the_wrapped_class(vllm):
    make = source(method(vllm, "vllm.v1.worker.gpu_worker", "Worker", "_make_model_runner"))
    assert "if self.use_v2_model_runner:" in make
    assert f"from {RUNNER} import GPUModelRunner as GPUModelRunnerV2" in make
    for name, expected in vllm_plugin.RUNNER_HOOKS.items():
        assert params(method(vllm, RUNNER, "GPUModelRunner", name)) == expected, name
    sample = source(method(vllm, RUNNER, "GPUModelRunner", "sample"))
    assert "sample_hidden_states = hidden_states[input_batch.logits_indices]" in sample
    assert "logits = self.model.compute_logits(sample_hidden_states)" in sample
    assert "self.model.compute_logits(hidden_states)" in source(
        method(vllm, RUNNER, "GPUModelRunner", "_dummy_sampler_run")
    )
    assert "self.sample(hidden_states, input_batch, grammar_output)" in source(
        method(vllm, RUNNER, "GPUModelRunner", "sample_tokens")
    )
    assert "model_runner.shutdown()" in source(
        method(vllm, "vllm.v1.worker.gpu_worker", "Worker", "shutdown")
    )
    assert set(vllm_plugin.ATTRS["runner"]) <= self_attributes(klass(vllm, RUNNER, "GPUModelRunner"))


def test_the_runner_config_facts(vllm):
    config = klass(vllm, "vllm.config.vllm", "VllmConfig")
    props = {
        n.name
        for n in config.body
        if isinstance(n, ast.FunctionDef) and "property" in [source(d) for d in n.decorator_list]
    }
    assert "use_v2_model_runner" in props
    assert "watermark_config" in class_fields(vllm, "vllm.config.vllm", "VllmConfig")
    state = class_fields(vllm, "vllm.v1.worker.gpu.model_states.interface", "ModelState")
    assert source(state["num_new_sampled_tokens_per_step"].value) == "1"
    spec = class_fields(vllm, "vllm.config.speculative", "SpeculativeConfig")["rejection_sample_method"]
    assert source(spec.value) == repr(vllm_plugin.STANDARD_REJECTION)
    methods = source(top(vllm, "vllm.config.speculative", "RejectionSampleMethod").value)
    assert repr(vllm_plugin.STANDARD_REJECTION) in methods


def test_input_batch_and_grammar_fields(vllm):
    batch = class_fields(vllm, "vllm.v1.worker.gpu.input_batch", "InputBatch")
    assert set(vllm_plugin.ATTRS["batch"]) <= set(batch), sorted(set(vllm_plugin.ATTRS["batch"]) - set(batch))
    grammar = class_fields(vllm, "vllm.v1.core.sched.output", "GrammarOutput")
    assert set(vllm_plugin.ATTRS["grammar"]) <= set(grammar)


def test_the_stock_sampler_classes(vllm):
    for name, module in vllm_plugin.SAMPLER_CLASSES.items():
        klass(vllm, module, name)
    # The runner builds exactly these unless a model state or watermarking substitutes its own (refused).
    load = source(method(vllm, RUNNER, "GPUModelRunner", "load_model"))
    assert "self.sampler = Sampler(**sampler_kwargs)" in load
    assert "self.rejection_sampler = RejectionSampler(" in load
    assert "custom = self.model_state.custom_sampler(self.sampler)" in load


def test_sampler_fields_used_for_eligibility(vllm):
    assert set(vllm_plugin.ATTRS["sampler"]) <= self_attributes(method(vllm, SAMPLER, "Sampler", "__init__"))
    states_init = method(vllm, STATES, "SamplingStates", "__init__")
    assert set(vllm_plugin.ATTRS["states"]) <= self_attributes(states_init)
    assert "self.temperature = UvaBackedTensor(" in source(states_init)
    token_ids = method(vllm, "vllm.v1.worker.gpu.sample.logprob", "LogprobTokenIdsState", "__init__")
    assert "self.num_token_ids = UvaBackedTensor(" in source(token_ids)
    uva = method(vllm, "vllm.v1.worker.gpu.buffer_utils", "UvaBackedTensor", "__init__")
    assert set(vllm_plugin.UVA_ATTRS) <= self_attributes(uva)
    # needs_logits_processing covers penalties, logit bias (allowed ids, min_tokens), bad words, custom
    # processors, the thinking budget, and temperature/top-k/top-p/min-p of non-greedy requests.
    add = source(method(vllm, SAMPLER, "Sampler", "add_request"))
    assert "self.needs_logits_processing[req_idx] = needs_processing" in add
    assert (
        "self.thinking_budget_state.add_request(" in add and "for processor in self.logits_processors:" in add
    )
    init = source(method(vllm, SAMPLER, "Sampler", "__init__"))
    assert "logit_bias_state, self.penalties_state, bad_words_state, *custom_logits_processors" in init
    assert "min_tokens" in source(
        method(vllm, "vllm.v1.worker.gpu.sample.logit_bias", "LogitBiasState", "add_request")
    )
    states_add = source(method(vllm, STATES, "SamplingStates", "add_request"))
    assert "self.temperature.np[req_idx] = temperature" in states_add
    assert "self.num_logprobs[req_idx] = num_logprobs" in states_add
    # Structured output masks exactly the requests GrammarOutput names, in sample() itself.
    assert "grammar_output.structured_output_request_ids" in source(
        method(vllm, RUNNER, "GPUModelRunner", "sample")
    )


# --- why argmax-equivalent logits give exactly the certified token ----------------------------------------------


def test_greedy_sampling_is_a_plain_argmax_of_the_logits(vllm):
    apply = source(method(vllm, SAMPLER, "Sampler", "apply_sampling_params"))
    assert (
        apply.startswith("def apply_sampling_params")
        and "if not np.any(self.needs_logits_processing[idx_mapping_np]):\n        return logits" in apply
    )
    noised = source(top(vllm, "vllm.v1.worker.gpu.sample.gumbel", "gumbel_noised_argmax"))
    assert "if temp != 0.0:" in noised and "return tl.max(logits, axis=0, return_indices=True)" in noised
    stats = source(top(vllm, REJECTION_UTILS, "_compute_local_logits_stats_kernel"))
    assert "if temp == 0.0:" in stats and "tl.max(target_logits, axis=0, return_indices=True)" in stats
    global_argmax = source(top(vllm, REJECTION_UTILS, "_compute_global_target_argmax"))
    assert "tl.argmax(local_max, axis=0)" in global_argmax


def test_greedy_verification_reads_the_rows_the_plugin_maps(vllm):
    kernel = source(top(vllm, REJECTION_UTILS, "_rejection_kernel"))
    assert "draft_sampled = tl.load(draft_sampled_ptr + logit_idx + 1)" in kernel  # row i ↔ input of row i+1
    assert "accepted = target_argmax == draft_sampled" in kernel
    assert "num_draft_tokens = end_idx - start_idx - 1" in kernel  # a request's last row is its bonus row
    bonus = source(top(vllm, REJECTION_UTILS, "_is_bonus_logit"))
    assert "expanded_local_pos_ptr + logit_idx + 1" in bonus and "next_local_pos == 0" in bonus
    gather = source(top(vllm, REJECTION, "_gather_draft_sampled_kernel"))
    assert "token_idx = tl.load(logits_indices_ptr + block, mask=mask)" in gather
    assert "token_id = tl.load(input_ids_ptr + token_idx, mask=mask)" in gather
    assert "token_id = tl.where(is_placeholder, -1, token_id)" in gather  # −1 only ever shortens vLLM's walk
    call = source(method(vllm, REJECTION, "RejectionSampler", "__call__"))
    assert (
        "gather_draft_sampled(input_batch.input_ids, input_batch.positions, input_batch.logits_indices"
        in call
    )


# --- the plugin reads nothing it has not declared ---------------------------------------------------------------


def test_the_plugin_reads_only_declared_attributes():
    seen: dict[str, set[str]] = {}
    for path in PLUGIN_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in vllm_plugin.ATTRS
                and isinstance(node.ctx, ast.Load)
                and not node.attr.startswith("_draftscope")  # the plugin's own mark on the processor
            ):
                seen.setdefault(node.value.id, set()).add(node.attr)
    for kind, attrs in seen.items():
        assert attrs <= set(vllm_plugin.ATTRS[kind]), (
            f"{kind}: {sorted(attrs - set(vllm_plugin.ATTRS[kind]))}"
        )
    assert set(seen) == set(vllm_plugin.ATTRS), sorted(set(vllm_plugin.ATTRS) - set(seen))


def test_the_plugin_reaches_vllm_only_through_symbols():
    for path in PLUGIN_SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "vllm" for a in node.names), path.name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "vllm", path.name
