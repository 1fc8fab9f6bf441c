"""Contract: hidden-state extraction and regeneration servers — speculators' `scripts/launch_vllm.py`, the vLLM 0.33.0
flags behind it and behind `vllm serve`, and torchrun's launcher flags.

`launch_vllm.py` is not in the speculators wheel: the train image installs a verbatim copy vendored at
`SCRIPTS_COMMIT` (`images/train/speculators/scripts/launch_vllm.py`; origin, licence and why this commit in
`images/train/speculators/README.md`). The test reads that very file, checked by its git blob hash, so it never needs
the network, and checks that the image's pins name the same commit and blob. vLLM is read from its pinned wheel.
Nothing is imported.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from releases import Release, ReleaseUnavailable, release_wheel

from draftscope.bench.backends.vllm.backend import PINNED_VERSION as VLLM_VERSION
from draftscope.core.presets import load_model_preset, model_preset_names
from draftscope.ops.images import dockerfile_args
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config

from support import unavailable

pytestmark = pytest.mark.contract

SCRIPTS_COMMIT = "c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b"
LAUNCH_VLLM_BLOB = (
    "4898bfb7c1d4dd9761bf8676f2cf112dfa0a1c54"  # `git rev-parse <commit>:scripts/launch_vllm.py`
)
ROOT = Path(__file__).resolve().parent.parent.parent
VENDORED = ROOT / "images" / "train" / "speculators"
LAUNCH_VLLM = VENDORED / "scripts" / "launch_vllm.py"
VLLM_PLATFORM = "manylinux_2_28_x86_64"


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module")
def launch_vllm() -> ast.Module:
    data = LAUNCH_VLLM.read_bytes()
    assert _git_blob(data) == LAUNCH_VLLM_BLOB, (
        f"{LAUNCH_VLLM} is not launch_vllm.py at {SCRIPTS_COMMIT} (git blob {_git_blob(data)}); vendor it again "
        "as images/train/speculators/README.md says"
    )
    return ast.parse(data.decode("utf-8"))


def test_the_vendored_script_is_the_one_the_train_image_uses_and_is_documented():
    """The train image installs the vendored copy: its Dockerfile pins the same commit and blob (the build checks
    the blob), the lock records the same commit, and the README's table names both."""
    args = dockerfile_args((ROOT / "images" / "train" / "Dockerfile").read_text(encoding="utf-8"))
    assert args.get("SPECULATORS_COMMIT") == SCRIPTS_COMMIT, (
        f"the train image pins speculators {args.get('SPECULATORS_COMMIT')}, the vendored launch_vllm.py is from"
        f" {SCRIPTS_COMMIT}: vendor it again at the pinned commit (images/train/speculators/README.md)"
    )
    assert args.get("LAUNCH_VLLM_BLOB") == LAUNCH_VLLM_BLOB == _git_blob(LAUNCH_VLLM.read_bytes())
    lock = json.loads((ROOT / "images" / "images.lock.json").read_text(encoding="utf-8"))
    assert lock["images"]["train"]["versions"]["speculators_commit"] == SCRIPTS_COMMIT
    readme = (VENDORED / "README.md").read_text(encoding="utf-8")
    assert SCRIPTS_COMMIT in readme and LAUNCH_VLLM_BLOB in readme and "Apache-2.0" in readme


@pytest.fixture(scope="module")
def vllm() -> Release:
    try:
        return Release(release_wheel("vllm", VLLM_VERSION, platform=VLLM_PLATFORM))
    except ReleaseUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def hsc() -> Release:
    try:
        return Release(release_wheel("hs-connectors", "0.9.0"))
    except ReleaseUnavailable as exc:
        pytest.fail(str(exc))


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


def split_options(argv: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for item in argv:
        if item.startswith("--"):
            out.append((item, []))
        elif out:
            out[-1][1].append(item)
    return out


# --- launch_vllm.py -----------------------------------------------------------------------------------------------


def script_flags(tree: ast.Module) -> dict[str, bool]:
    """flag → takes a value, from the script's `parser.add_argument(...)` calls."""
    flags: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = [
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")
            ]
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            switch = (
                isinstance(action, ast.Constant) or getattr(action, "attr", "") == "BooleanOptionalAction"
            )
            for name in names:
                flags[name] = not switch
                if getattr(action, "attr", "") == "BooleanOptionalAction":
                    flags["--no-" + name[2:]] = False
    return flags


def test_launch_vllm_flags_exist_and_the_rest_goes_to_vllm(launch_vllm, hsc):
    flags = script_flags(launch_vllm)
    transfer = hsc.source("hs_connectors.transfer")
    assert '"--hidden-states-path"' in transfer and '@HiddenStatesBackend.register("file")' in transfer
    flags["--hidden-states-path"] = True  # the file backend's add_launch_args
    source = ast.unparse(launch_vllm)
    assert "parse_known_args()" in source and "vllm_args.remove('--')" in source
    assert "'eagle_aux_hidden_state_layer_ids': target_layer_ids" in source
    assert (
        "target_layer_ids.append(num_hidden_layers)" in source
    )  # --include-last-layer appends the final index
    checked = 0
    for preset, draft, argv in commands("hsextract", "server"):
        assert argv[0] == "python" and argv[1].endswith("/launch_vllm.py")
        own = argv[3 : argv.index("--")]
        for flag, values in split_options(own):
            assert flag in flags, f"{preset}/{draft}: launch_vllm.py has no {flag}"
            assert bool(values) == flags[flag], f"{flag}: {values}"
        assert split_options(own)[0] == ("--hidden-states-backend", ["file"])
        checked += 1
    assert checked


# --- vLLM 0.33.0 ----------------------------------------------------------------------------------------------------


def _class_fields(vllm: Release, module: str, cls: str) -> dict[str, str]:
    for node in vllm.tree(module).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                s.target.id: ast.unparse(s.annotation)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise KeyError(f"{cls} not in {module}")


def _config_class(vllm: Release, name: str) -> dict[str, str]:
    for module in sorted(
        n[:-3].replace("/", ".") for n in vllm._names if n.startswith("vllm/config/") and n.endswith(".py")
    ):
        try:
            return _class_fields(vllm, module, name)
        except KeyError:
            continue
    raise KeyError(name)


def vllm_flags(vllm: Release) -> dict[str, bool]:
    """Every `vllm serve` flag → whether it is a bool (so `--no-` works): the engine's explicit add_argument
    calls, typed by the config field their `**X_kwargs["field"]` comes from, and the frontend's fields."""
    tree = vllm.tree("vllm.engine.arg_utils")
    kwargs_class: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "get_kwargs"
            and node.value.args
        ):
            kwargs_class[node.targets[0].id] = node.value.args[0].id
    flags: dict[str, bool] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        is_bool = False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", "") in kwargs_class:
                fields = _config_class(vllm, kwargs_class[sub.value.id])
                is_bool = "bool" in fields.get(sub.slice.value, "")
        for name in names:
            flags[name] = is_bool
            if is_bool:
                flags["--no-" + name[2:]] = True
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        for name, annotation in _class_fields(vllm, "vllm.entrypoints.common.cli_args", cls).items():
            flags["--" + name.replace("_", "-")] = "bool" in annotation
    return flags


def vllm_args_of(stage: str) -> Iterator[tuple[str, str, list[str]]]:
    prefix = "server"
    for preset, draft, argv in commands(stage, prefix):
        if stage == "hsextract":
            yield preset, draft, argv[argv.index("--") + 1 :]
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
            seen.add(flag)
    assert {"--tensor-parallel-size", "--port", "--max-model-len"} <= seen


def test_values_the_pipeline_passes_to_vllm_are_valid(vllm):
    backends = re.search(
        r"DistributedExecutorBackend = Literal\[(.*?)\]", vllm.source("vllm.config.parallel")
    )
    assert "mp" in ast.literal_eval(f"[{backends.group(1)}]")
    assert 'If set to `"vllm"`, no\n    generation config is loaded' in vllm.source("vllm.config.model")
    entry = vllm._zip.read(f"vllm-{VLLM_VERSION}.dist-info/entry_points.txt").decode()
    assert "vllm = vllm.entrypoints.cli.main:main" in entry
    assert 'name = "serve"' in vllm.source("vllm.entrypoints.cli.serve")
    assert "extract_hidden_states" in vllm.source("vllm.config.speculative")
    assert vllm.has_module("vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector")


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
