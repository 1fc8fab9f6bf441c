"""Contract: what the pipeline hands SGLang exists in the pinned release, SGLang 0.5.23.

- `python -m sglang.launch_server` flags (serve and bench): SGLang 0.5.23 generates its CLI from annotated config
  fields (`A[type, "help"]` / `A[type, Arg(...)]` in `sglang/srt/arg_groups/fields/*.py`: `--field-name`, aliases,
  `no_cli`, bools as `store_true`) plus a few explicit `add_argument` calls in `server_args.py`.
- The speculative algorithm names and the DSpark block flag's meaning (gamma = drafted tokens).
- convert's output: the three draft architectures are model classes SGLang registers, and every key convert writes
  is one SGLang reads (`dflash_config` fields in `dflash_utils.py`, DSpark's in `dspark_config.py` and `models/dspark.py`,
  `sample_from_anchor` defaulting to true when absent — which is why convert always writes it).

The wheel is read with `ast`, never imported (it needs CUDA).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from releases import SGLANG_PLATFORM, SGLANG_VERSION, Release, pinned_release

from draftscope.core.presets import model_preset_names
from draftscope.ops.contracts import clis
from draftscope.ops.contracts.reading import string_constants
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.pipeline.stages.convert import checkpoint as C

pytestmark = pytest.mark.contract

VERSION = SGLANG_VERSION


@pytest.fixture(scope="module")
def sglang() -> Release:
    return pinned_release("sglang", VERSION, platform=SGLANG_PLATFORM)


def test_the_wheel_is_the_pinned_release(sglang):
    assert sglang.metadata("Version") == VERSION
    assert sglang.has_module("sglang.launch_server")


# --- launch_server flags -------------------------------------------------------------------------------------------


def launch_flags(sglang: Release) -> dict[str, bool]:
    """flag → is a switch (`store_true`), for every CLI flag of `launch_server` (`clis.sglang_launch_flags`), after
    checking the naming and `store_true` rules of SGLang's own generator it mirrors."""
    source = sglang.source("sglang.srt.arg_groups.arg_utils")
    assert 'return "--" + name.replace("_", "-")' in source and 'action="store_true"' in source
    return {flag: form == clis.SWITCH for flag, form in clis.sglang_launch_flags(sglang).items()}


def server_commands() -> Iterator[tuple[str, str, str, list[str]]]:
    for preset in model_preset_names():
        for draft in DRAFTS:
            plan = planning.build(
                load_pipeline_config(draft=draft, preset=preset),
                registry.select("serve,bench"),
                Path("/tmp/w"),
                "docker",
            )
            for sp in plan.stages:
                for command in sp.commands:
                    yield preset, draft, sp.stage.name, list(command.argv)


def test_every_launch_server_flag_exists_with_its_form(sglang):
    flags = launch_flags(sglang)
    checked = 0
    for preset, draft, stage, argv in server_commands():
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        options: list[tuple[str, list[str]]] = []
        for item in argv[3:]:
            if item.startswith("--"):
                options.append((item, []))
            else:
                options[-1][1].append(item)
        for flag, values in options:
            assert flag in flags, f"{preset}/{draft} {stage}: SGLang {VERSION} has no {flag}"
            assert (values == []) == flags[flag], f"{flag}: {values}"
        checked += 1
    assert checked >= len(model_preset_names()) * len(DRAFTS) * 2  # serve and bench, at least one instance


def test_tp_is_spelled_out(sglang):
    """`--tp` is not a flag of 0.5.23 (only an argparse abbreviation): the kit writes `--tp-size`."""
    flags = launch_flags(sglang)
    assert "--tp-size" in flags and "--tp" not in flags


def test_speculative_algorithms_and_the_dspark_block(sglang):
    spec = sglang.source("sglang.srt.arg_groups.fields.spec")
    assert "Builtins: EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, DFLASH, DSPARK" in spec
    assert "Alias of --speculative-num-draft-tokens for DFLASH" in spec
    # gamma = the number of drafted tokens; the verify window is gamma + 1 (what serve passes, see convert).
    assert "Draft block size gamma (number of proposed draft tokens)" in spec


# --- convert's output is what SGLang reads -------------------------------------------------------------------------


def classes(sglang: Release, module: str) -> set[str]:
    return {n.name for n in ast.walk(sglang.tree(module)) if isinstance(n, ast.ClassDef)}


def entry_classes(sglang: Release, module: str) -> set[str]:
    for node in sglang.tree(module).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EntryClass" for t in node.targets):
            return {e.id for e in node.value.elts} if isinstance(node.value, ast.List) else set()
    return set()


def test_the_draft_architectures_are_registered_model_classes(sglang):
    dflash = classes(sglang, "sglang.srt.models.dflash") & (
        entry_classes(sglang, "sglang.srt.models.dflash") or set()
    )
    dspark = entry_classes(sglang, "sglang.srt.models.dspark")
    assert {C.ARCHITECTURES["dflash"], C.ARCHITECTURES["dflash2"]} <= dflash
    assert C.ARCHITECTURES["dspark"] in dspark


def test_every_key_convert_writes_is_read_by_sglang(sglang):
    dflash_utils = string_constants(sglang, "sglang.srt.speculative.dflash_utils")
    assert "dflash_config" in dflash_utils
    for key in (*C.DFLASH_CONFIG_KEYS, *C.DFLASH2_KEYS):
        assert key in dflash_utils, key
    dspark_config = string_constants(sglang, "sglang.srt.speculative.dspark_components.dspark_config")
    for key in (*C.DSPARK_KEYS, "sample_from_anchor", "mask_token_id"):
        assert key in dspark_config, key
    dspark_model = string_constants(sglang, "sglang.srt.models.dspark")
    for key in ("enable_confidence_head", "confidence_head_with_markov", "markov_rank"):
        assert key in dspark_model, key


def test_sglangs_reading_rules_match_convert(sglang):
    """dflash_config first, then the top level; DSpark's anchor flag from the top level, true when absent."""
    utils = sglang.source("sglang.srt.speculative.dflash_utils")
    assert '"target_layer_ids",\n        _cfg_get(draft_hf_config, "target_layer_ids", None)' in utils
    assert 'dflash_cfg.get(\n        "num_target_layers",' in utils
    dspark = sglang.source("sglang.srt.speculative.dspark_components.dspark_config")
    assert 'return bool(_cfg_get(draft_hf_config, "sample_from_anchor", True))' in dspark
    assert (
        "self.query_token_num = self.gamma if self.sample_from_anchor else self.gamma + 1"
        in sglang.source("sglang.srt.speculative.dspark_components.dspark_draft")
    )
    # DFLASH's verify block starts with the anchor as the bonus token (the reason dflash/dflash2 refuse
    # sample_from_anchor=true).
    assert "# pos 0 = anchor" in sglang.source("sglang.srt.speculative.dflash_worker_v2")


def test_a_converted_config_reads_back_the_way_sglang_parses_it():
    """convert.sglang_view mirrors the precedence above on a converted DSpark config written without the flag."""
    config = {
        "architectures": ["Qwen3DSparkModel"],
        "dflash_config": {"block_size": 7, "target_layer_ids": [1]},
    }
    assert C.sglang_view(config)["dspark_sample_from_anchor"] is True  # absent → true, as SGLang reads it


# --- the CPU twin: serve and bench on SGLang's CPU engine, in the sglang-cpu image's release ----------------------


def test_the_cpu_commands_exist_with_their_form_in_the_cpu_twins_release():
    """On a CPU the stages start SGLang 0.5.18 (the sglang-cpu image), whose CLI comes from the annotated fields of
    `ServerArgs` itself: every flag the CPU plan emits is there, a switch where the argv gives no value."""
    from draftscope.core.images import lock_entry

    version = lock_entry("sglang-cpu")["versions"]["sglang"]
    flags = clis.sglang_launch_flags(pinned_release("sglang", version, platform=SGLANG_PLATFORM))
    plan = planning.build(
        load_pipeline_config(draft="dflash", preset="tiny", opts=["serve.draft=model"]),
        registry.select("serve,bench"),
        Path("/tmp/w"),
        "docker",
    )
    assert plan.context.cpu
    checked = 0
    for sp in plan.stages:
        for command in sp.commands:
            argv = list(command.argv)
            assert argv[:3] == ["python", "-m", "sglang.launch_server"] and "--device" in argv
            for i, item in enumerate(argv[3:], start=3):
                if not item.startswith("--"):
                    continue
                takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                assert item in flags, f"{item} is not a flag of SGLang {version}"
                assert (flags[item] == clis.SWITCH) is not takes_value, (item, flags[item])
                checked += 1
    assert checked >= 2 * 15  # every flag of both stages' servers
