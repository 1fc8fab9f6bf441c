"""Contract: every field of a speculators checkpoint that vLLM's speculators adapter reads is classified by convert's
vLLM table (`convert/vllm_semantics.py`), and the causality rule it mirrors still reads so in the pinned vLLM.

vLLM serves the speculators checkpoint as it is; its adapter (`vllm/transformers_utils/configs/speculators/`)
turns the checkpoint config into the draft's config. Its reads are `config_dict["x"]`, `config_dict.get("x", …)`,
and `config_dict.get(key)` in a loop over a tuple of names. The wheel is read with `ast`, never imported.
"""

from __future__ import annotations

import ast

import pytest
from releases import Release, pinned_release

from draftscope.bench.backends.vllm import backend as B
from draftscope.pipeline.stages.convert import vllm_semantics as V

pytestmark = pytest.mark.contract

ADAPTER = "vllm.transformers_utils.configs.speculators.algos"
BASE = "vllm.transformers_utils.configs.speculators.base"
FUNCTIONS = {
    "update_dflash",
    "update_dflash2",
    "update_dspark",
    "extract_vllm_speculative_config",
    "extract_transformers_pre_trained_config",
    "validate_speculators_config",
    "build_vllm_speculative_config",
}


@pytest.fixture(scope="module")
def vllm() -> Release:
    return pinned_release("vllm", B.PINNED_VERSION, platform="manylinux_2_28_x86_64")


def adapter_reads(trees: list[ast.Module]) -> set[str]:
    """The checkpoint fields the adapter's functions read from `config_dict`."""
    found: set[str] = set()
    for tree in trees:
        for fn in ast.walk(tree):
            if not (isinstance(fn, ast.FunctionDef) and fn.name in FUNCTIONS):
                continue
            loops: dict[str, list[str]] = {}
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.For)
                    and isinstance(node.target, ast.Name)
                    and isinstance(node.iter, ast.Tuple)
                ):
                    loops[node.target.id] = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
            for node in ast.walk(fn):
                key = None
                if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "config_dict":
                    key = node.slice
                elif isinstance(node, ast.Call) and ast.unparse(node.func) == "config_dict.get" and node.args:
                    key = node.args[0]
                if isinstance(key, ast.Constant):
                    found.add(key.value)
                elif isinstance(key, ast.Name) and key.id in loops:
                    found.update(loops[key.id])
    return found


def test_every_checkpoint_field_vllm_reads_is_classified(vllm):
    reads = adapter_reads([vllm.tree(ADAPTER), vllm.tree(BASE)])
    for name in sorted(reads):
        print(f"{name:30} {V.READS[name].kind if name in V.READS else 'UNCLASSIFIED'}")
    assert {
        "sliding_window_non_causal",
        "sample_from_anchor",
        "mask_token_id",
    } <= reads  # the walk sees the adapter
    assert reads - set(V.READS) == set(), "classify in convert/vllm_semantics.py"
    assert set(V.READS) - reads == set()  # no stale entry


def test_a_field_vllm_starts_reading_fails_the_contract(vllm):
    source = vllm.source(ADAPTER)
    anchor = '    aux_layer_ids = config_dict["aux_hidden_state_layer_ids"]\n'
    assert anchor in source
    changed = source.replace(anchor, anchor + '    _ = config_dict.get("brand_new_field", 1)\n', 1)
    reads = adapter_reads([ast.parse(changed), vllm.tree(BASE)])
    assert reads - set(V.READS) == {"brand_new_field"}


def test_the_causality_rules_the_table_mirrors(vllm):
    adapter = vllm.source(ADAPTER)
    assert (
        'pre_trained_config["dflash_config"]["causal"] = not config_dict.get(\n'
        '        "sliding_window_non_causal", True\n    )'
    ) in adapter
    dspark = adapter[adapter.index('@register_speculator("dspark")') :]
    assert "sliding_window_non_causal" not in dspark.split("\n@register_speculator")[0]
    assert 'sample_from_anchor = config_dict.get("sample_from_anchor", False)' in dspark
    model = vllm.source("vllm.model_executor.models.qwen3_dflash")
    assert (
        '    is_causal = getattr(config, "is_causal", None)\n'
        "    if is_causal is not None:\n        return bool(is_causal)\n"
        '    override = (getattr(config, "dflash_config", None) or {}).get("causal")\n'
        "    if override is not None:\n        return bool(override)\n"
        '    layer_types = getattr(config, "layer_types", None)\n'
        "    if not layer_types:\n        return False\n"
        "    return layer_types[layer_idx] == _SLIDING_ATTENTION\n"
    ) in model
    assert "class Qwen3DSparkModel(DFlashQwen3Model):" in vllm.source(
        "vllm.model_executor.models.qwen3_dspark"
    )
