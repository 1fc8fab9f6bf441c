"""Contract: every flag the pipeline passes to speculators exists in the pinned release, speculators 0.9.0.

The release's wheel (and its `hs-connectors` 0.9.0 dependency, which adds the hidden-state backend flags) is read
with `ast`, never imported. Checked, for every model preset × draft type the pipeline plans:
- `python -m speculators prepare-data …` and `python -m speculators generate-offline-data …`: the subcommands are
  registered on the CLI app and every option is a parameter of the typer command (bool switches included);
- `torchrun … -m speculators.train …`: the module entry point exists; every flag is generated from a field of
  `TrainConfig`'s schema (the trainer builds its argparse parser from those fields), bool flags have the form the
  field's default gives them, and every choice value is in the field's `Literal`;
- the speculator types are registered, rows with `input_ids` + `loss_mask` bypass the render endpoint, and the
  checkpoint config fields convert reads exist (with the anchor defaults convert relies on).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from releases import Release, pinned_release

from draftscope.core.presets import model_preset_names
from draftscope.ops.contracts import clis
from draftscope.ops.contracts.surface import split_options
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.pipeline.stages.convert import checkpoint as C

pytestmark = pytest.mark.contract

VERSION = "0.9.0"  # images/train/requirements.in pins speculators==0.9.0 and hs-connectors comes with it


@pytest.fixture(scope="module")
def spec() -> Release:
    return pinned_release("speculators", VERSION)


@pytest.fixture(scope="module")
def hsc() -> Release:
    return pinned_release("hs-connectors", VERSION)


def test_the_wheels_are_the_pinned_releases(spec, hsc):
    assert spec.metadata("Version") == VERSION
    assert hsc.metadata("Version") == VERSION
    requires = (spec.metadata("Requires-Dist") or "") + " ".join(
        line
        for line in spec._zip.read(next(n for n in spec._names if n.endswith("METADATA")))
        .decode()
        .splitlines()
        if line.startswith("Requires-Dist: hs-connectors")
    )
    assert f"hs-connectors=={VERSION}" in requires


# --- the planned commands --------------------------------------------------------------------------------------


def planned(stage: str) -> Iterator[tuple[str, str, list[str]]]:
    """(preset, draft, upstream argv) of one stage for every preset × draft type, docker and local runtimes."""
    for preset in model_preset_names():
        for draft in DRAFTS:
            for runtime in ("docker",):
                resolved = load_pipeline_config(draft=draft, preset=preset)
                plan = planning.build(resolved, registry.select("all"), Path("/tmp/w"), runtime)
                (sp,) = [s for s in plan.stages if s.stage.name == stage]
                argvs = [list(sp.step.argv)] + [list(c.argv) for c in sp.commands]
                for argv in argvs:
                    yield (
                        preset,
                        draft,
                        argv[argv.index("--") + 1 :]
                        if argv[:4] == ["python", "-m", "draftscope.pipeline", "exec"]
                        else argv,
                    )
    for draft in DRAFTS:  # the CPU path (tiny preset, local runtime, the trainer's device shim)
        resolved = load_pipeline_config(draft=draft, preset="tiny", opts=["device=cpu"])
        plan = planning.build(resolved, registry.select(stage), Path("/tmp/w"), "local")
        argv = list(plan.stages[0].step.argv)
        yield "tiny", draft, argv[argv.index("--") + 1 :] if "exec" in argv[:5] else argv


# --- typer commands (prepare-data, generate-offline-data) --------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "command", "module", "function"),
    [
        ("prepare", "prepare-data", "speculators.cli.prepare_data", "prepare_data"),
        (
            "hsextract",
            "generate-offline-data",
            "speculators.cli.generate_offline_data",
            "generate_offline_data",
        ),
    ],
)
def test_typer_commands_and_every_option_exist(spec, stage, command, module, function):
    assert spec.has_module("speculators.__main__")  # `python -m speculators`
    assert clis.typer_commands(spec)[command] == function
    options = clis.typer_parameters(spec, module, function)
    known = {flag: opt for opt in options.values() for flag in opt.flags}
    checked = 0
    for preset, draft, argv in planned(stage):
        if argv[:4] != ["python", "-m", "speculators", command]:
            continue
        checked += 1
        for flag, values in split_options(argv[4:]):
            assert flag in known, f"{preset}/{draft}: {command} has no option {flag}"
            if known[flag].is_bool:
                assert values == [], f"{flag} is a switch and takes no value"
            else:
                assert len(values) == 1, f"{flag} takes one value, got {values}"
    assert checked, f"no {command} command was planned"


def test_prepare_data_bypasses_the_render_endpoint_for_pretokenized_rows(spec):
    tree = spec.tree("speculators.data_generation.preprocessing")
    sets = [
        {e.value for e in node.elts if isinstance(e, ast.Constant)}
        for node in ast.walk(tree)
        if isinstance(node, ast.Set)
    ]
    assert {"input_ids", "loss_mask"} in sets
    options = clis.typer_parameters(spec, "speculators.cli.prepare_data", "prepare_data")
    assert "render_endpoint" in options  # exists, and the pipeline never passes it
    assert options["skip_token_freq"].flags == {"--skip-token-freq", "--no-skip-token-freq"}


def test_offline_hidden_states_layout(spec):
    text = spec.source("speculators.data_generation.offline")
    assert 'f"hs_{idx}.safetensors"' in text and '{"token_ids", "hidden_states"}' in text
    data = spec.source("speculators.train.data")
    assert 'loaded_hs["hidden_states"][:, :-1]' in data  # the last slot is the verifier's final layer


# --- the trainer's flags ----------------------------------------------------------------------------------------


def train_flags(spec: Release, hsc: Release) -> dict[str, str]:
    """flag → form (`clis.train_flags`), after checking the rules of speculators' own resolution it mirrors."""
    # speculators/train/config/resolution.py: `"--" + dest.replace("_", "-")`, BooleanOptionalAction for bools
    # defaulting to True/None or tagged optional, store_true otherwise; plus --config / --dump-config and the
    # hidden-state backends' own flags.
    resolution = spec.source("speculators.train.config.resolution")
    assert 'return "--" + dest.replace("_", "-")' in resolution
    assert 'argparse.BooleanOptionalAction if optional else "store_true"' in resolution
    transfer = hsc.source("hs_connectors.transfer")
    assert '@HiddenStatesBackend.register("file")' in transfer and '"--hidden-states-path"' in transfer
    flags = clis.train_flags(spec, hsc)
    assert flags["--config"] == flags["--hidden-states-path"] == clis.VALUE
    return flags


def test_the_trainer_runs_as_a_module_under_torchrun(spec):
    assert spec.has_module("speculators.train.__main__")
    assert "TrainConfig.resolve()" in spec.source("speculators.train.__main__")


def test_every_train_flag_exists_with_its_form_and_choices(spec, hsc):
    flags = train_flags(spec, hsc)
    fields = clis.train_fields(spec)
    checked = 0
    for preset, draft, argv in planned("train"):
        module = (
            "speculators.train"
            if "speculators.train" in argv
            else "draftscope.pipeline.stages.train.cpu_train"
        )
        trainer = argv[argv.index(module) + 1 :]
        checked += 1
        for flag, values in split_options(trainer):
            assert flag in flags, f"{preset}/{draft}: speculators.train has no flag {flag}"
            form = flags[flag]
            if form == clis.SWITCH:
                assert values == [], f"{flag} is a switch"
                name = flag[2:].replace("-", "_")
                if name not in fields:  # the negative form of a switch
                    f = fields[name.removeprefix("no_")]
                    assert f.negatable, f"{flag}: the trainer has no --no- form for {f.name}"
            elif form == clis.VALUES:
                assert values, f"{flag} needs values"
            else:
                assert len(values) == 1, f"{flag} takes one value, got {values}"
                if choices := clis.choices_of(form):
                    assert values[0] in choices, f"{flag} {values[0]} not in {choices}"
    assert checked == (len(model_preset_names()) + 1) * len(DRAFTS)


def test_the_kits_dflash_family_choices_are_known_values(spec, hsc):
    flags = train_flags(spec, hsc)
    assert set(DRAFTS) <= registered_speculator_types(spec)
    on_missing = clis.choices_of(flags["--on-missing"])
    assert on_missing and "raise" in on_missing
    assert "file" in hsc.source("hs_connectors.transfer")
    # The draft types the trainer's speculator-type field documents (it is a plain str, checked by the registry).
    assert flags["--speculator-type"] == clis.VALUE


def registered_speculator_types(release: Release) -> set[str]:
    found = set()
    for draft in ("dflash", "dflash2", "dspark", "eagle3"):
        module = f"speculators.models.{draft}.config"
        if release.has_module(module):
            for node in ast.walk(release.tree(module)):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", "") == "register"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    found.add(node.args[0].value)
    return found


def test_dflash2_rejects_a_reduced_vocabulary_so_the_kit_passes_none(spec):
    assert "DFlash2 currently requires the full verifier vocabulary" in spec.source(
        "speculators.models.dflash2.core"
    )
    cli = spec.source("speculators.train.cli")
    assert "Using full verifier vocab" in cli  # no --draft-vocab-size and no token_freq.pt → full vocabulary


# --- checkpoint fields convert reads ------------------------------------------------------------------------------


def config_fields(release: Release, draft: str) -> dict[str, object]:
    """Field name → default of a speculators config class and the DFlash base it extends."""
    out: dict[str, object] = {}
    for module in ("speculators.models.dflash.config", f"speculators.models.{draft}.config"):
        for node in ast.walk(release.tree(module)):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                default = None
                if isinstance(node.value, ast.Call):
                    kw = {k.arg: k.value for k in node.value.keywords}
                    if isinstance(kw.get("default"), ast.Constant):
                        default = kw["default"].value
                elif isinstance(node.value, ast.Constant):
                    default = node.value.value
                out[node.target.id] = default
    return out


@pytest.mark.parametrize("draft", DRAFTS)
def test_checkpoint_fields_convert_reads_exist(spec, draft):
    fields = config_fields(spec, draft)
    needed = {
        "speculators_model_type",
        "transformer_layer_config",
        "draft_vocab_size",
        "block_size",
        "target_hidden_size",
        "aux_hidden_state_layer_ids",
        "mask_token_id",
        "sample_from_anchor",
        "sliding_window_non_causal",
    }
    if draft == "dflash2":
        needed |= set(C.DFLASH2_KEYS)
    if draft == "dspark":
        needed |= {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"}
    assert needed <= set(fields), needed - set(fields)
    assert fields["speculators_model_type"] == draft
    # The anchor defaults the kit's explicit train flags and convert's checks are written against.
    assert fields["sample_from_anchor"] is (draft == "dspark")


def test_layer_id_convention_matches_speculators_own_converter(spec):
    """speculators' DFlash converter maps z-lab/SGLang ids to its own as `i + 1`: convert inverts exactly that."""
    tree = spec.tree("speculators.convert.dflash.converter")
    shifts = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ListComp)
        and isinstance(n.elt, ast.BinOp)
        and isinstance(n.elt.op, ast.Add)
        and getattr(n.elt.right, "value", None) == 1
        and getattr(n.generators[0].iter, "id", "") == "target_layer_ids"
    ]
    assert shifts
