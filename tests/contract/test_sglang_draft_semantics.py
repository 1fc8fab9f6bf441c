"""Contract: every config attribute SGLang 0.5.23's draft classes read is classified by convert's semantic table,
and every SGLang rule the mask probe re-implements still reads so in the pinned source.

The walk starts at the three architectures convert writes (`DFlashDraftModel`, `DFlash2DraftModel`,
`Qwen3DSparkModel`) and the DSpark worker's config readers, and follows every module-level function or class they
name across the draft modules. In what it reaches, a config read is `config.x`, `getattr(config, "x", default)`,
`hasattr(config, "x")`, `helper(config, "x", …)` (`_cfg_get`, `_get_nested_config`), `config.get("x")`, on any
receiver named like a raw config (`config`, `text_config`, `draft_hf_config`, `dflash_cfg`, …) or returned by a
`_get_…config(…)` helper; methods (`get_text_config`) are not fields. The parsed
dataclasses (`draft_config`, `dspark_config`, `draft_cfg`) are left out: their fields are the raw reads inside the
parse functions, which the walk covers. Keys inside `rope_parameters` (copied whole) are not listed.

A new SGLang release that reads a field the table does not know fails here, naming it, instead of silently
applying its default to converted drafts. The wheel is read with `ast`, never imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from releases import SGLANG_PLATFORM, SGLANG_VERSION, Release, pinned_release

from draftscope.pipeline.stages.convert import checkpoint as C
from draftscope.pipeline.stages.convert import semantics as S

pytestmark = pytest.mark.contract

MODULES = (
    "sglang.srt.models.dflash",
    "sglang.srt.models.dspark",
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.speculative.dspark_components.dspark_config",
    "sglang.srt.utils.hf_transformers.common",  # get_rope_config
)
ROOTS = (
    *sorted(set(C.ARCHITECTURES.values())),
    "parse_dflash_draft_config",  # the DFLASH worker's reader
    "resolve_runtime_config",  # the DSPARK worker's
    "get_dspark_sample_from_anchor",
)
RAW = re.compile(r"^(self\.)?\w*(config|cfg)$")
PARSED = {"draft_config", "self.draft_config", "dspark_config", "draft_cfg"}
METHODS = {"get", "get_text_config", "pop", "items", "keys", "to_dict"}


@pytest.fixture(scope="module")
def sglang() -> Release:
    return pinned_release("sglang", SGLANG_VERSION, platform=SGLANG_PLATFORM)


@pytest.fixture(scope="module")
def speculators() -> Release:
    return pinned_release("speculators", "0.9.0")  # images/train/requirements.in


def _raw(node: ast.expr) -> bool:
    """A raw config: a name like one, or what a `_get_…config(…)` helper returns (the nested dicts)."""
    if isinstance(node, ast.Call):
        return bool(re.match(r"^_get_\w*config$", getattr(node.func, "id", "")))
    text = ast.unparse(node)
    return bool(RAW.match(text)) and text not in PARSED


def reachable(trees: dict[str, ast.Module]) -> list[ast.AST]:
    """The module-level definitions the roots name, transitively, across `trees`."""
    defs: dict[str, list[ast.AST]] = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs.setdefault(node.name, []).append(node)
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        for node in defs[name]:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and sub.id in defs:
                    todo.append(sub.id)
                elif isinstance(sub, ast.Attribute) and sub.attr in defs:
                    todo.append(sub.attr)
    assert set(ROOTS) <= seen, set(ROOTS) - seen
    return [node for name in sorted(seen) for node in defs[name]]


def config_reads(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """attribute → the definitions that read it from a raw draft config."""
    found: dict[str, set[str]] = {}
    for top in reachable(trees):
        for node in ast.walk(top):
            name = None
            if isinstance(node, ast.Call):
                args = node.args
                if len(args) >= 2 and _raw(args[0]) and isinstance(args[1], ast.Constant):
                    name = args[1].value  # getattr / hasattr / _cfg_get / _get_nested_config
                elif (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "pop")
                    and _raw(node.func.value)
                    and args
                    and isinstance(args[0], ast.Constant)
                ):
                    name = args[0].value
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _raw(node.value):
                name = None if node.attr in METHODS else node.attr
            elif (
                isinstance(node, ast.Subscript) and _raw(node.value) and isinstance(node.slice, ast.Constant)
            ):
                name = node.slice.value
            if isinstance(name, str) and name not in METHODS:
                found.setdefault(name, set()).add(top.name)
    return found


def trees_of(sglang: Release) -> dict[str, ast.Module]:
    return {m: sglang.tree(m) for m in MODULES}


def unclassified(reads: dict[str, set[str]]) -> dict[str, set[str]]:
    return {name: where for name, where in reads.items() if name not in S.BY_NAME}


def test_every_config_attribute_the_draft_classes_read_is_classified(sglang):
    reads = config_reads(trees_of(sglang))
    for name in sorted(reads):
        kind = S.BY_NAME[name].kind if name in S.BY_NAME else "UNCLASSIFIED"
        print(f"{name:34} {kind:9} read in {', '.join(sorted(reads[name]))}")
    assert len(reads) >= 60  # the walk reaches the draft classes (0.5.23: 61 attributes)
    missing = unclassified(reads)
    assert not missing, "classify in convert/semantics.py: " + ", ".join(
        f"{n} (read in {sorted(w)})" for n, w in sorted(missing.items())
    )


def test_an_attribute_sglang_starts_reading_fails_the_contract(sglang):
    """A copy of the pinned source with one new read, in each form the walk knows, is caught, naming it."""
    source = sglang.source("sglang.srt.models.dflash")
    anchor = "        draft_config = self.draft_config = parse_dflash_draft_config(\n"
    assert source.count(anchor) == 1  # inside DFlashDraftModel.__init__
    for read in (
        'getattr(config, "brand_new_field", 0)',
        'config.get("brand_new_field")',
        "config.brand_new_field",
        '_cfg_get(config, "brand_new_field", None)',
    ):
        changed = source.replace(anchor, f"        _unused = {read}\n{anchor}")
        trees = {**trees_of(sglang), "sglang.srt.models.dflash": ast.parse(changed)}
        assert unclassified(config_reads(trees)) == {"brand_new_field": {"DFlashDraftModel"}}, read


def test_every_field_convert_writes_for_sglang_is_one_sglang_reads(sglang):
    """A renamed field upstream would leave convert writing a dead key while SGLang applies its default."""
    reads = config_reads(trees_of(sglang))
    written = {f.name for f in S.FIELDS if f.kind in ("written", "copied") and f.via == "sglang"}
    assert written - set(reads) == set()
    assert {f.name for f in S.FIELDS if f.kind != "written" or f.via == "sglang"} <= set(reads)


# --- the rules the mask probe re-implements (convert/probe.py), line by line --------------------------------------


def test_the_causality_rules_the_probe_mirrors(sglang):
    dflash = sglang.source("sglang.srt.models.dflash")
    for line in (
        'is_causal = getattr(text_config, "is_causal", None)',
        "    if is_causal is None:\n        return default\n",
        "return AttentionType.DECODER if is_causal else AttentionType.ENCODER_ONLY",
        "    if layer_types is None:\n        return -1, AttentionType.ENCODER_ONLY\n",
        'if layer_type == "full_attention":\n        return -1, _get_dflash_attention_type(\n'
        "            config, default=AttentionType.ENCODER_ONLY\n",
        'if layer_type == "sliding_attention":\n        sliding_window_size = '
        "get_dflash_attention_sliding_window_size(config)\n",
        "        return sliding_window_size, _get_dflash_attention_type(\n            config, default=AttentionType.DECODER\n",
    ):
        assert line in dflash, line
    utils = sglang.source("sglang.srt.speculative.dflash_utils")
    assert "return int(sliding_window) - 1" in utils
    assert 'layer_types = _cfg_get(text_config, "layer_types", _cfg_get(config, "layer_types"))' in utils


def test_the_window_rule_the_probe_mirrors(sglang):
    fa = sglang.source("sglang.srt.layers.attention.flashattention_backend")
    assert (
        "if is_swa_layer and layer.attn_type == AttentionType.ENCODER_ONLY:\n"
        "            window_size = (layer.sliding_window_size, layer.sliding_window_size)\n"
        "        elif is_swa_layer:\n"
        "            window_size = (layer.sliding_window_size, 0)\n"
    ) in fa
    assert "# here is two side inclusive" in fa


def test_the_mask_token_rules(sglang):
    utils = sglang.source("sglang.srt.speculative.dflash_utils")
    assert 'DEFAULT_DFLASH_MASK_TOKEN = "<|MASK|>"' in utils  # what an absent mask_token becomes
    worker = sglang.source("sglang.srt.speculative.dflash_worker_v2")
    assert "token_id_from_vocab = tokenizer.get_vocab().get(mask_token, None)" in worker
    assert "conflicts with tokenizer vocab id" in worker  # a string mapped to another id refuses to start


def test_sglang_loads_the_draft_config_with_the_transformers_the_probe_uses(sglang, speculators):
    """The probe loads the converted config with the train image's transformers: speculators 0.9.0 caps it at
    5.19.0, the version SGLang 0.5.23 pins (Qwen3Config drops sliding_window without use_sliding_window)."""
    from draftscope.pipeline.stages.convert import probe

    requires = sglang._zip.read("sglang-0.5.23.dist-info/METADATA").decode()
    assert f"Requires-Dist: transformers=={probe.SGLANG_TRANSFORMERS}" in requires
    assert "transformers<=5.19.0" in speculators._zip.read("speculators-0.9.0.dist-info/METADATA").decode()
    lock = (Path(__file__).resolve().parents[2] / "images" / "train" / "requirements.lock").read_text()
    assert f"\ntransformers=={probe.SGLANG_TRANSFORMERS} " in lock  # where convert (and its probe) runs


def test_speculators_training_mask_is_what_the_probe_runs(speculators):
    core = speculators.source("speculators.models.dflash.core")
    assert "if layer_idx in self.sliding_window_indices\n                else full_attn_mask" in core
    assert "def _build_attention_mask(self, loss_mask, max_anchors, document_ids, device):" in core
    mask = speculators.source("speculators.models.dflash.attention")
    assert "non_causal = sliding_window is None or sliding_window_non_causal" in mask
    assert "(kv_base_pos >= q_anchor - sliding_window)" in mask  # the window counts back from the anchor
    for module in ("speculators.models.dflash2.core", "speculators.models.dspark.core"):
        assert "_build_attention_mask" not in speculators.source(module)  # both inherit DFlash's
