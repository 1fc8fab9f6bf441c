"""Contract: the hidden-state extraction and regeneration servers against vLLM 0.33.0, and torchrun's launcher flags.

hsextract starts vLLM itself — `python -m vllm.entrypoints.cli.main serve MODEL --speculative-config JSON
--kv-transfer-config JSON …`, the engine configuration speculators' `scripts/launch_vllm.py` builds (that script is
not in speculators' wheel; the kit writes the configuration, `hsextract.speculative_config` and
`hsextract.kv_transfer_config`). Every name in it is checked here against the pinned wheel: the CLI module and its
`serve` subcommand, the speculative method, the config fields, the layer-ids key the extraction reads, the KV
connector's registration and the extra-config key it reads, the KV role, and each flag. The names come from the
stage's own constants and argv, so a rename on either side fails here. vLLM is read from its wheel with `ast`
(`releases.py`); nothing is imported.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from releases import Release, pinned_release

from draftscope.bench.backends.vllm.backend import PINNED_VERSION as VLLM_VERSION
from draftscope.core.presets import load_model_preset, model_preset_names
from draftscope.ops.contracts import clis
from draftscope.ops.contracts import reading as R
from draftscope.ops.contracts.surface import split_options
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.pipeline.stages import hsextract as H
from draftscope.runtime.step import RUN_MOUNT

from support import unavailable

pytestmark = pytest.mark.contract

VLLM_PLATFORM = "manylinux_2_28_x86_64"
# The prefix of every hsextract server: `python -m <CLI> serve MODEL`, then vLLM's own flags.
SERVE_PREFIX = 5


@pytest.fixture(scope="module")
def vllm() -> Release:
    return pinned_release("vllm", VLLM_VERSION, platform=VLLM_PLATFORM)


def commands(stage: str, prefix: str) -> Iterator[tuple[str, str, list[str]]]:
    for preset in model_preset_names():
        for draft in DRAFTS:
            plan = planning.build(
                load_pipeline_config(draft=draft, preset=preset),
                registry.select(stage),
                Path("/tmp/w"),
                "docker",
            )
            for command in plan.stages[0].commands:
                if command.name.startswith(prefix):
                    yield preset, draft, list(command.argv)


def literal_values(tree: ast.Module, alias: str) -> set[str]:
    """The strings a module-level `Alias = Literal[...]` admits, following aliases of other Literals."""
    aliases = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Subscript)
        and getattr(node.value.value, "id", "") == "Literal"
    }
    assert alias in aliases, f"{alias} is no Literal alias"
    out: set[str] = set()
    items = aliases[alias].slice
    for item in items.elts if isinstance(items, ast.Tuple) else [items]:
        if isinstance(item, ast.Constant):
            out.add(item.value)
        elif isinstance(item, ast.Name):
            out |= literal_values(tree, item.id)
    return out


def getattr_keys(tree: ast.AST) -> set[str]:
    """The attribute names read with `getattr(obj, "name", ...)`."""
    return {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    }


def class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def server_configs(argv: list[str]) -> tuple[dict, dict]:
    options = dict(split_options(argv[SERVE_PREFIX:]))
    (speculative,) = options["--speculative-config"]
    (transfer,) = options["--kv-transfer-config"]
    return json.loads(speculative), json.loads(transfer)


# --- hsextract's server: vLLM's CLI, `serve`, and the extraction configuration ----------------------------------


def test_the_server_is_the_serve_subcommand_of_vllms_cli_module(vllm):
    checked = 0
    for preset, draft, argv in commands("hsextract", "server"):
        assert argv[:4] == ["python", "-m", H.VLLM_CLI, "serve"], f"{preset}/{draft}: {argv[:4]}"
        assert not argv[4].startswith("-"), "the model is serve's positional model_tag"
        checked += 1
    assert checked
    # `python -m` runs the module's `__main__` guard, which calls main()
    tree = vllm.tree(H.VLLM_CLI)
    guards = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) and "__main__" in ast.unparse(n.test)
    ]
    assert guards and "main()" in ast.unparse(guards[0].body[0])
    # main() registers the serve module's subcommands (CMD_MODULES); that module's cmd_init returns a subcommand
    # whose name is "serve", and serve's parser takes the model as the positional `model_tag`
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    modules = next(
        n.value
        for n in ast.walk(main)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "CMD_MODULES"
    )
    assert "vllm.entrypoints.cli.serve" in [ast.unparse(e) for e in modules.elts]
    serve = vllm.tree("vllm.entrypoints.cli.serve")
    init = next(n for n in serve.body if isinstance(n, ast.FunctionDef) and n.name == "cmd_init")
    returned = [
        ast.unparse(e.func) for r in ast.walk(init) if isinstance(r, ast.Return) for e in r.value.elts
    ]
    names = {
        cls: [
            s.value.value
            for s in class_node(serve, cls).body
            if isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "name"
        ]
        for cls in returned
    }
    assert ["serve"] in names.values(), names
    positional = [
        n.args[0].value
        for n in ast.walk(vllm.tree("vllm.entrypoints.common.cli_args"))
        if isinstance(n, ast.Call)
        and getattr(n.func, "attr", "") == "add_argument"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    ]
    assert "model_tag" in positional


def test_extract_hidden_states_is_a_speculative_method_configured_as_the_kit_does(vllm):
    tree = vllm.tree("vllm.config.speculative")
    assert H.EXTRACT_METHOD in literal_values(tree, "SpeculativeMethod")
    fields = clis.class_annotations(vllm, "vllm.config.speculative", "SpeculativeConfig")
    spec = H.speculative_config([2, 5], 9)
    assert set(spec) <= set(fields), f"not SpeculativeConfig fields: {set(spec) - set(fields)}"
    assert fields["method"].startswith("SpeculativeMethod")
    # The method's branch reads the layer ids from the dict form the kit passes: draft_model_config["hf_config"]
    branches = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Compare)
        and ast.unparse(n.test.left) == "self.method"
        and [ast.unparse(c) for c in n.test.comparators] == [repr(H.EXTRACT_METHOD)]
    ]
    reads = {
        ast.unparse(s)
        for b in branches
        for stmt in b.body
        for s in ast.walk(stmt)
        if isinstance(s, ast.Subscript)
    }
    assert "self.draft_model_config['hf_config']" in reads, reads
    assert list(spec["draft_model_config"]) == ["hf_config"]
    # One speculative token: vLLM's proposer for the method refuses any other number
    assert spec["num_speculative_tokens"] == 1
    proposer = vllm.source("vllm.v1.worker.gpu.spec_decode.extract_hidden_states")
    assert "extract_hidden_states requires num_speculative_tokens to be 1" in proposer


def test_the_extraction_reads_the_layer_ids_key(vllm):
    spec = H.speculative_config([2, 5], 9)
    assert list(spec["draft_model_config"]["hf_config"]) == [H.LAYER_IDS_KEY]
    for module in (
        "vllm.model_executor.models.extract_hidden_states",  # the model: one cache slot per layer id
        "vllm.v1.spec_decode.extract_hidden_states",  # the proposers capture those layers
        "vllm.v1.worker.gpu.spec_decode.extract_hidden_states",
        "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector",  # sizes each file
    ):
        assert H.LAYER_IDS_KEY in getattr_keys(vllm.tree(module)), f"{module} does not read {H.LAYER_IDS_KEY}"


def test_the_connector_is_registered_and_reads_the_storage_path(vllm):
    registered = {
        n.args[0].value: (n.args[1].value, n.args[2].value)
        for n in ast.walk(vllm.tree("vllm.distributed.kv_transfer.kv_connector.factory"))
        if isinstance(n, ast.Call)
        and ast.unparse(n.func) == "KVConnectorFactory.register_connector"
        and all(isinstance(a, ast.Constant) for a in n.args[:3])
    }
    transfer = H.kv_transfer_config("/scratch")
    assert transfer["kv_connector"] == H.CONNECTOR
    assert H.CONNECTOR in registered, f"registered: {sorted(registered)}"
    module, cls = registered[H.CONNECTOR]
    connector = class_node(vllm.tree(module), cls)
    keys = {
        n.args[0].value
        for n in ast.walk(connector)
        if isinstance(n, ast.Call)
        and getattr(n.func, "attr", "") == "get_from_extra_config"
        and isinstance(n.args[0], ast.Constant)
    }
    assert H.STORAGE_PATH_KEY in keys, f"{cls} reads {sorted(keys)}"
    assert transfer["kv_connector_extra_config"] == {H.STORAGE_PATH_KEY: "/scratch"}
    # The role: a producer (vLLM refuses a connector without one, and an unknown one)
    config = vllm.tree("vllm.config.kv_transfer")
    assert transfer["kv_role"] == H.KV_ROLE
    assert H.KV_ROLE in literal_values(config, "KVProducer")
    fields = clis.class_annotations(vllm, "vllm.config.kv_transfer", "KVTransferConfig")
    assert set(transfer) <= set(fields), f"not KVTransferConfig fields: {set(transfer) - set(fields)}"
    assert fields["kv_role"].startswith("KVRole")


def test_the_server_passes_the_configs_the_kit_builds():
    """What the contract above checks is what every preset's servers are given."""
    for preset, draft, argv in commands("hsextract", "server"):
        speculative, transfer = server_configs(argv)
        model = load_model_preset(preset)
        assert speculative["method"] == H.EXTRACT_METHOD, f"{preset}/{draft}"
        assert (
            speculative["draft_model_config"]["hf_config"][H.LAYER_IDS_KEY][-1]
            == model.architecture.num_layers
        )
        assert transfer["kv_connector"] == H.CONNECTOR and transfer["kv_role"] == H.KV_ROLE
        assert transfer["kv_connector_extra_config"][H.STORAGE_PATH_KEY].startswith(f"{RUN_MOUNT}/hsextract/")


# --- vLLM 0.33.0 ----------------------------------------------------------------------------------------------------


def vllm_flags(vllm: Release) -> dict[str, bool]:
    """Every `vllm serve` flag → whether it is a bool (so `--no-` works): `clis.vllm_serve_flags`, the engine's
    explicit add_argument calls typed by the config field their `**X_kwargs["field"]` comes from, and the
    frontend's fields (both frontend classes defined in vllm.entrypoints.common.cli_args in this release)."""
    for name in clis.FRONTEND_CLASSES:
        where, _ = R.cls(vllm, "vllm.entrypoints.common.cli_args", name)
        assert where == "vllm.entrypoints.common.cli_args", f"{name} is defined in {where}"
    return {flag: form == clis.SWITCH for flag, form in clis.vllm_serve_flags(vllm).items()}


def vllm_args_of(stage: str) -> Iterator[tuple[str, str, list[str]]]:
    prefix = "server"
    for preset, draft, argv in commands(stage, prefix):
        if stage == "hsextract":
            yield preset, draft, argv[SERVE_PREFIX:]
        elif argv[:2] == ["vllm", "serve"]:  # the tiny preset's default CPU path runs the kit's own stand-in
            yield preset, draft, argv[3:]
    if stage == "regen":
        # the tiny preset with regen.server=vllm: vLLM's OpenAI server module on the CPU backend (`--model DIR`
        # instead of the positional model; the same engine arguments)
        resolved = load_pipeline_config(preset="tiny", opts=["regen.server=vllm"])
        plan = planning.build(resolved, registry.select(stage), Path("/tmp/w"), "local")
        (server,) = plan.stages[0].commands
        assert list(server.argv[:3]) == ["python", "-m", "vllm.entrypoints.openai.api_server"]
        yield "tiny", "regen.server=vllm", list(server.argv[3:])


@pytest.mark.parametrize("stage", ["regen", "hsextract"])
def test_every_vllm_flag_exists_in_the_pinned_release(vllm, stage):
    flags = vllm_flags(vllm)
    seen = set()
    for preset, draft, args in vllm_args_of(stage):
        for flag, values in split_options(args):
            assert flag in flags, f"{preset}/{draft}: vLLM {VLLM_VERSION} has no {flag}"
            if flag.startswith("--no-") or flag == "--disable-custom-all-reduce":
                assert flags[flag] and not values, f"{flag} is a switch"
            elif values:
                assert not flags[flag], f"{preset}/{draft}: {flag} is a switch, given {values}"
            seen.add(flag)
    assert {"--tensor-parallel-size", "--port", "--max-model-len"} <= seen
    if stage == "hsextract":
        assert {"--speculative-config", "--kv-transfer-config", "--no-enable-prefix-caching"} <= seen


def test_values_the_pipeline_passes_to_vllm_are_valid(vllm):
    backends = re.search(
        r"DistributedExecutorBackend = Literal\[(.*?)\]", vllm.source("vllm.config.parallel")
    )
    assert "mp" in ast.literal_eval(f"[{backends.group(1)}]")
    assert 'If set to `"vllm"`, no\n    generation config is loaded' in vllm.source("vllm.config.model")
    entry = vllm._zip.read(f"vllm-{VLLM_VERSION}.dist-info/entry_points.txt").decode()
    assert "vllm = vllm.entrypoints.cli.main:main" in entry


@pytest.mark.parametrize(
    "preset", [p for p in model_preset_names() if load_model_preset(p).architecture.is_hybrid]
)
def test_bug1_the_gdn_flags_are_real_vllm_flags(vllm, preset):
    flags = vllm_flags(vllm)
    assert flags["--disable-custom-all-reduce"] and "--distributed-executor-backend" in flags
    assert "VLLM_BATCH_INVARIANT" in vllm.source("vllm.envs")  # it exists, and the kit never sets it


# --- torchrun ---------------------------------------------------------------------------------------------------------


def test_torchrun_flags():
    """torch's launcher (read from the installed torch's source; the train image pins torch 2.14.0)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        unavailable("torch is not installed here")
    source = (Path(spec.origin).parent / "distributed" / "run.py").read_text(encoding="utf-8")
    for flag in ('"--standalone"', '"--nproc_per_node"'):
        assert flag in source
