"""The pipeline's plan and dry run: every model preset × draft type, each stage's image and argv, the six
integration bugs visible in the argv, stage selection, and the dry run's promises (no file, no torch, fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.core.errors import UserError
from draftscope.core.presets import load_model_preset, model_preset_names
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import DRAFTS, load_pipeline_config
from draftscope.runtime import get_runtime

from support import wall_bound

PRESETS = model_preset_names()
HYBRID = [p for p in PRESETS if load_model_preset(p).architecture.is_hybrid]
DENSE = [p for p in PRESETS if not load_model_preset(p).architecture.is_hybrid]
EXPECTED_IMAGES = {
    "regen": "vllm",
    "pretokenize": "train",
    "prepare": "train",
    "hsextract": "train",
    "train": "train",
    "convert": "train",
    "serve": "sglang",
    "bench": "sglang",
}
INVOKE_PIPELINE = (
    "from invoke import Collection, Program; from draftscope.cli.pipeline import PIPELINE_TASKS; "
    "Program(namespace=Collection(*PIPELINE_TASKS), binary='invoke').run()"
)


def build(preset="qwen38-27b", draft="dflash", stage="all", runtime="docker", opts=(), workdir="/tmp/w"):
    resolved = load_pipeline_config(draft=draft, preset=preset, opts=opts)
    return planning.build(resolved, registry.select(stage), Path(workdir), runtime)


def stage_plan(plan, name):
    (found,) = [sp for sp in plan.stages if sp.stage.name == name]
    return found


def values_after(argv, flag):
    """The values following `flag` up to the next option."""
    argv = list(argv)
    i = argv.index(flag)
    out = []
    for item in argv[i + 1 :]:
        if item.startswith("--"):
            break
        out.append(item)
    return out


def upstream(argv):
    argv = list(argv)
    return argv[argv.index("--") + 1 :] if "--" in argv else argv


# --- every preset × draft type ----------------------------------------------------------------------------------


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_and_draft_plans_all_eight_stages(preset, draft):
    plan = build(preset, draft)
    assert [sp.stage.name for sp in plan.stages] == list(registry.NAMES)
    # On a CPU (the tiny preset) SGLang's stages run its CPU engine, in the sglang-cpu image.
    cpu = {"serve": "sglang-cpu", "bench": "sglang-cpu"} if plan.context.cpu else {}
    assert {sp.stage.name: sp.step.image for sp in plan.stages} == {**EXPECTED_IMAGES, **cpu}
    lines = planning.dry_run_lines(plan, get_runtime("docker"))
    model = load_model_preset(preset)
    fetches = model.source == "hub"  # the pinned target snapshot is fetched first, and shown
    assert sum(line.startswith("docker run ") for line in lines) == len(EXPECTED_IMAGES) + fetches
    assert any(line.startswith("# [fetch] ") for line in lines) == fetches
    ids = list(model.dflash.target_layer_ids)
    shifted = [str(i + 1) for i in ids]
    train = upstream(stage_plan(plan, "train").step.argv)
    assert values_after(train, "--target-layer-ids") == shifted
    assert values_after(train, "--speculator-type") == [draft]
    assert values_after(train, "--block-size") == [str(model.dflash.block_size)]
    assert values_after(train, "--num-layers") == [str(model.dflash.num_draft_layers)]
    assert values_after(train, "--max-anchors") == [str(model.training.max_anchors)]
    convert = stage_plan(plan, "convert").step.argv
    assert values_after(convert, "--target-layer-ids") == [str(i) for i in ids]
    assert values_after(convert, "--num-target-layers") == [str(model.architecture.num_layers)]
    if model.source == "hub":
        for command in stage_plan(plan, "hsextract").commands:
            if command.name.startswith("server"):
                (speculative,) = values_after(command.argv, "--speculative-config")
                layers = json.loads(speculative)["draft_model_config"]["hf_config"]
                assert layers == {
                    "eagle_aux_hidden_state_layer_ids": [*map(int, shifted), model.architecture.num_layers]
                }


REQUIRED_TRAIN_FLAGS = {
    "dflash": {
        "--loss-fn": ["ce"],
        "--per-position-loss-weight": ["dpace"],
        "--dflash-decay-gamma": None,
    },
    "dflash2": {
        "--loss-fn": ["kl_div"],
        "--per-position-loss-weight": ["fixed-exp-decay"],
        "--conv-kernel-size": ["2"],
        "--conv-group-size": ["16"],
        "--selector-rank": ["256"],
        "--selector-top-k": ["16"],
        "--selector-loss-alpha": ["1.0"],
        "--sliding-window": ["2048"],
    },
    "dspark": {
        "--markov-rank": ["256"],
        "--markov-head-type": ["vanilla"],
        "--confidence-head-alpha": ["1.0"],
    },
}
REQUIRED_SWITCHES = {
    "dflash": ["--no-sample-from-anchor", "--no-sliding-window-non-causal"],
    "dflash2": ["--no-sample-from-anchor", "--sliding-window-non-causal"],
    "dspark": ["--sample-from-anchor", "--enable-confidence-head", "--confidence-head-with-markov"],
}


@pytest.mark.parametrize("draft", DRAFTS)
def test_each_draft_type_has_its_complete_train_argv(draft):
    train = upstream(stage_plan(build("qwen38-27b", draft), "train").step.argv)
    for flag, value in REQUIRED_TRAIN_FLAGS[draft].items():
        assert flag in train, flag
        if value is not None:
            assert values_after(train, flag) == value, flag
    for switch in REQUIRED_SWITCHES[draft]:
        assert switch in train, switch
    for flag in ("--on-missing", "--hidden-states-path", "--data-path", "--save-path", "--mask-token-id"):
        assert flag in train
    assert values_after(train, "--on-missing") == ["raise"]
    assert train[:4] == ["torchrun", "--standalone", "--nproc_per_node", "8"]
    assert train[4:6] == ["-m", "speculators.train"]


def test_dspark_options_flow_into_train_convert_and_serve():
    opts = ["train.dspark.sample_from_anchor=false", "train.dspark.markov_head_type=gated"]
    plan = build("qwen38-27b", "dspark", opts=opts)
    train = upstream(stage_plan(plan, "train").step.argv)
    assert "--no-sample-from-anchor" in train and values_after(train, "--markov-head-type") == ["gated"]
    assert "--no-sample-from-anchor" in stage_plan(plan, "convert").step.argv
    serve = stage_plan(plan, "serve").commands[0].argv
    # gamma = drafted tokens: block 8 without the anchor drafts 7
    assert values_after(serve, "--speculative-dspark-block-size") == ["7"]
    assert values_after(serve, "--speculative-algorithm") == ["DSPARK"]


@pytest.mark.parametrize("draft", ["dflash", "dflash2"])
def test_dflash_family_is_served_under_dflash_with_the_block_size(draft):
    serve = stage_plan(build("qwen38-27b", draft), "serve").commands[0].argv
    assert values_after(serve, "--speculative-algorithm") == ["DFLASH"]
    assert values_after(serve, "--speculative-num-draft-tokens") == ["8"]
    assert "--enable-metrics" in serve and "--disable-radix-cache" in serve


# --- the six integration bugs (docs/develop/integration-bugs.md), each visible in the plan---------------------------------------------------------


@pytest.mark.parametrize("preset", HYBRID)
def test_bug1_hybrid_targets_turn_off_custom_all_reduce_in_every_vllm_command(preset):
    plan = build(preset, "dflash2")
    vllm_commands = [
        c
        for name in ("regen", "hsextract")
        for c in stage_plan(plan, name).commands
        if c.name.startswith("server")
    ]
    assert vllm_commands
    for command in vllm_commands:
        argv = list(command.argv)
        assert "--disable-custom-all-reduce" in argv
        assert values_after(argv, "--distributed-executor-backend") == ["mp"]


@pytest.mark.parametrize("preset", PRESETS)
def test_bug1_no_stage_ever_sets_batch_invariance(preset):
    plan = build(preset, "dflash")
    for sp in plan.stages:
        assert not any("VLLM_BATCH_INVARIANT" in k for k in sp.step.env)
        for command in sp.commands:
            assert "VLLM_BATCH_INVARIANT" not in command.env
            assert not any("VLLM_BATCH_INVARIANT" in a for a in command.argv)


@pytest.mark.parametrize("preset", DENSE)
def test_bug1_dense_targets_keep_vllm_defaults(preset):
    plan = build(preset, "dflash")
    for command in stage_plan(plan, "regen").commands:
        assert "--disable-custom-all-reduce" not in command.argv


@pytest.mark.parametrize("preset", PRESETS)
def test_bug2_prepare_reads_pretokenized_rows_without_a_render_endpoint(preset):
    plan = build(preset, "dflash")
    prepare = upstream(stage_plan(plan, "prepare").step.argv)
    assert prepare[:4] == ["python", "-m", "speculators", "prepare-data"]
    assert not any(a.startswith("--render-endpoint") for a in prepare)
    assert values_after(prepare, "--data")[0].endswith("pretokenize/rows.jsonl")
    assert "--overwrite" in prepare  # a forced rerun must not keep a stale dataset


def test_bug2_and_3_pretokenize_runs_first_with_the_targets_own_tokenizer():
    plan = build("qwen38-27b", "dflash")
    argv = stage_plan(plan, "pretokenize").step.argv
    assert argv[:4] == ("python", "-m", "draftscope.pipeline", "pretokenize")
    assert values_after(argv, "--tokenizer") == [plan.context.layout.tokenizer]
    assert values_after(argv, "--input")[0].endswith("regen/rows.jsonl")  # regen runs in this invocation


@pytest.mark.parametrize("preset", PRESETS)
def test_bug4_dflash2_trains_on_the_full_vocabulary(preset):
    plan = build(preset, "dflash2")
    train = upstream(stage_plan(plan, "train").step.argv)
    assert "--draft-vocab-size" not in train and "--token-freq-path" not in train
    assert "--skip-token-freq" in upstream(stage_plan(plan, "prepare").step.argv)
    convert = stage_plan(plan, "convert").step.argv
    assert values_after(convert, "--vocab-size") == [str(load_model_preset(preset).architecture.vocab_size)]
    for flag in ("--conv-kernel-size", "--conv-group-size", "--selector-rank", "--selector-top-k"):
        assert flag in convert


@pytest.mark.parametrize("stage", ["regen", "hsextract", "serve", "bench"])
def test_bug5_two_27b_targets_on_four_gpus_get_their_own_masks_and_tp(stage):
    sp = stage_plan(build("qwen38-27b", "dflash2"), stage)
    servers = [c for c in sp.commands if c.name.startswith("server")]
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in servers] == ["0,1", "2,3"]
    tp_flag = {"regen": "--tensor-parallel-size", "hsextract": "--tensor-parallel-size"}.get(
        stage, "--tp-size"
    )
    assert [values_after(c.argv, tp_flag) for c in servers] == [["2"], ["2"]]
    assert len({c.port for c in servers}) == 2
    gpus = [g for c in servers for g in c.gpus]
    assert len(gpus) == len(set(gpus))


def test_bug6_regen_and_hsextract_shard_rows_over_instances():
    plan = build("qwen38-27b", "dflash2")
    clients = [c for c in stage_plan(plan, "hsextract").commands if c.name.startswith("client")]
    assert [values_after(c.argv, "--rank") for c in clients] == [["0"], ["1"]]
    assert all(values_after(c.argv, "--world-size") == ["2"] for c in clients)
    assert all("--fail-on-error" in c.argv for c in clients)
    regen = stage_plan(plan, "regen")
    assert len([c for c in regen.commands if c.name.startswith("server")]) == 2
    assert "--output-dir" in regen.step.argv and "--max-retries" in regen.step.argv


# --- instance plans: validated before anything starts ------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "field", "words"),
    [
        (["serve.instances=[{gpus: [0, 1]}, {gpus: [1, 2]}]"], "serve.instances[1].gpus", "GPU 1"),
        (["serve.instances=[{gpus: [0, 1], tp: 4}]"], "serve.instances[0].tp", "tensor-parallel size 4"),
        (
            ["serve.instances=[{gpus: [0], port: 9000}, {gpus: [1], port: 9000}]"],
            "serve.instances[1].port",
            "9000",
        ),
        (["gpus=4", "serve.instances=[{gpus: [3, 4]}]"], "serve.instances[0].gpus", "GPU 4"),
        (["regen.instances=[{gpus: [0, 1]}, {gpus: [0]}]"], "regen.instances[1].gpus", "GPU 0"),
    ],
)
def test_instance_plans_are_rejected_with_one_line_errors(opts, field, words):
    with pytest.raises(UserError) as info:
        build("qwen38-27b", "dflash", opts=opts)
    text = info.value.render()
    assert "\n" not in text and field in text and words in text


def test_configured_instances_set_masks_tp_and_ports():
    plan = build("qwen38-27b", "dflash", opts=["serve.instances=[{gpus: [4, 5, 6, 7], port: 31000}]"])
    (server,) = stage_plan(plan, "serve").commands
    assert server.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and server.port == 31000
    assert values_after(server.argv, "--tp-size") == ["4"]


def test_busy_ports_are_refused_before_a_stage_starts():
    import socket

    from draftscope.pipeline.base import ResolvedInstance, check_ports_free

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} is already in use"):
            check_ports_free([ResolvedInstance(0, (0,), 1, port)], "serve.instances")


# --- selection, config and errors -------------------------------------------------------------------------------


def test_stage_selection_is_in_pipeline_order_and_unknown_names_list_the_valid_ones():
    assert [s.name for s in registry.select("train,prepare")] == ["prepare", "train"]
    with pytest.raises(UserError, match="choose all or any of: regen, pretokenize"):
        registry.select("prepare,trian")


def test_config_file_then_flags_then_opts(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(
        "schema_version: 1\nname: mine\ndraft: dspark\nmodel_preset: qwen3-8b\ntrain: {epochs: 3}\n"
    )
    resolved = load_pipeline_config(config_file=str(run), opts=["train.epochs=5"])
    assert (resolved.config.draft, resolved.config.model_preset, resolved.config.train.epochs) == (
        "dspark",
        "qwen3-8b",
        5,
    )
    assert load_pipeline_config(draft="dflash2", config_file=str(run)).config.draft == "dflash2"
    train = upstream(stage_plan(build("qwen3-8b", "dflash", opts=["train.epochs=5"]), "train").step.argv)
    assert values_after(train, "--epochs") == ["5"]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"opts": ["trian.epochs=2"]}, "unknown key 'trian'"),
        ({"draft": "eagle3"}, "choose one of: dflash, dflash2, dspark"),
        ({"preset": "qwen9"}, "no model preset named 'qwen9'"),
        ({"opts": ["device=cpu"]}, "cannot run on a CPU"),
        ({"opts": ["train.dspark.markov_rank=0"]}, "markov_rank"),
    ],
)
def test_bad_configs_fail_with_the_field_named(kwargs, words):
    with pytest.raises(UserError, match=words):
        load_pipeline_config(**kwargs)


def test_the_local_runtime_plans_host_paths(tmp_path):
    plan = build("qwen3-8b", "dflash", stage="prepare", runtime="local", workdir=str(tmp_path / "w"))
    argv = get_runtime("local").argv(
        plan.stages[0].step,
        __import__("draftscope.runtime").runtime.Context(run_dir=tmp_path / "w", run_id="w"),
    )
    assert argv[0] == sys.executable
    assert f"{tmp_path}/w/pretokenize/rows.jsonl" in argv


# --- the dry run through invoke: prints everything, creates nothing, imports no torch, fast -----------------------


def run_task(*args, cwd, extra_env=None):
    env = {**os.environ, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-c", INVOKE_PIPELINE, "pipeline", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dry_run_prints_all_stages_creates_nothing_imports_no_torch_and_is_fast(tmp_path):
    tripwire = tmp_path / "tripwire"
    for name in ("torch", "transformers", "vllm", "sglang", "speculators"):
        (tripwire / name).mkdir(parents=True)
        (tripwire / name / "__init__.py").write_text(f"raise ImportError('tripwire: {name} imported')\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {"PYTHONPATH": str(tripwire), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    result = run_task("--stage", "all", "--dry-run", cwd=cwd, extra_env=env)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count("docker run ") == 9  # the eight stages and, before them, the fetch step (network on)
    assert "# [fetch] the pinned target snapshot (runs first); network on" in out
    for stage, image in EXPECTED_IMAGES.items():
        assert f"] {stage}: " in out
        assert f"localhost/draftscope-{image}:" in out
    assert "speculators.train" in out and "sglang.launch_server" in out and "--speculator-type dflash " in out
    assert (
        "vllm.entrypoints.cli.main serve " in out and '"method": "extract_hidden_states"' in out
    )  # hsextract
    assert list(cwd.iterdir()) == []  # no workdir, no file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "tripwire"]
    assert elapsed < wall_bound(
        3.0
    )  # the command itself measures well under a second; the bound absorbs a loaded CI machine
    timed = run_task("--stage", "all", "--dry-run", "--draft", "dflash2", cwd=cwd, extra_env=env)
    assert timed.returncode == 0


def test_dry_run_in_process_is_well_under_a_second():
    started = time.monotonic()
    for draft in DRAFTS:
        plan = build("qwen38-27b", draft)
        planning.dry_run_lines(plan, get_runtime("docker"))
    assert (time.monotonic() - started) / len(DRAFTS) < wall_bound(0.5)


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    result = run_task("--stage", "trian", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "unknown stage 'trian'" in result.stderr
    overlap = run_task("--dry-run", "--opts", "serve.instances=[{gpus: [0, 1]}, {gpus: [1]}]", cwd=tmp_path)
    assert overlap.returncode == 2 and "instances never share a GPU" in overlap.stderr


@pytest.mark.parametrize("stage", ["prepare", "train"])
def test_exec_stages_parse_as_the_in_container_entry_reads_them(stage):
    """The wrapper's own options come before the stage name; everything after `--` is the upstream argv, intact."""
    from draftscope.pipeline.__main__ import parser

    argv = list(stage_plan(build("qwen38-27b", "dflash2", stage=stage), stage).step.argv)
    args = parser().parse_args(argv[3:])
    assert args.stage == stage and args.result.endswith(f"stages/{stage}.result.json")
    assert [a for a in args.argv if a != "--"] == upstream(argv)


def test_the_tiny_preset_defaults_to_the_cpu_path():
    plan = build("tiny", "dflash", runtime="local")
    assert plan.config.device == "cpu"
    train = upstream(stage_plan(plan, "train").step.argv)
    assert train[:3] == ["python", "-m", "draftscope.pipeline.stages.train.cpu_train"]
    for flag, value in (
        ("--loss-implementation", "eager"),
        ("--draft-attn-impl", "sdpa"),
        ("--num-workers", "0"),
    ):
        assert values_after(train, flag) == [value]
    assert "--no-resume-from-checkpoint" in train
    assert stage_plan(plan, "hsextract").step.argv[3] == "hsextract-transformers"
    assert all(sp.step.gpus == 0 for sp in plan.stages)


# --- regen's server on a CPU: the stand-in (fast path) or vLLM's CPU backend --------------------------------------


def regen_server(plan):
    (server,) = stage_plan(plan, "regen").commands
    return server


def test_tiny_regen_defaults_to_the_stand_in_and_stages_nothing(tmp_path):
    plan = build("tiny", stage="regen", runtime="local", workdir=str(tmp_path / "w"))
    server = regen_server(plan)
    assert list(server.argv[:4]) == ["python", "-m", "draftscope.pipeline", "tinyserve"]
    assert "--stage-tiny-target" not in stage_plan(plan, "regen").step.argv
    assert any("stand-in" in note and "regen.server=vllm" in note for note in stage_plan(plan, "regen").notes)


def test_tiny_regen_on_vllm_serves_the_staged_target_with_the_gpu_flags_that_apply(tmp_path):
    from draftscope.pipeline.stages import regen

    workdir = tmp_path / "w"
    plan = build("tiny", stage="regen", runtime="local", opts=["regen.server=vllm"], workdir=str(workdir))
    server = regen_server(plan)
    staged = f"{workdir}/models/tiny-target"
    assert list(server.argv[:3]) == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert values_after(server.argv, "--model") == [staged]
    client = stage_plan(plan, "regen").step.argv
    assert values_after(client, "--stage-tiny-target") == [staged]
    gpu = regen_server(build("qwen3-8b", stage="regen"))
    assert (
        list(gpu.argv[:2]) == ["vllm", "serve"]
        and "--stage-tiny-target" not in stage_plan(build("qwen3-8b", stage="regen"), "regen").step.argv
    )
    for flag in ("--served-model-name", "--host", "--tensor-parallel-size", "--seed", "--generation-config"):
        assert values_after(server.argv, flag) == values_after(gpu.argv, flag), flag
    assert values_after(server.argv, "--max-model-len") == ["128"]  # the tiny preset's training.seq_length
    assert "--enforce-eager" in server.argv and "--enforce-eager" not in gpu.argv
    assert values_after(server.argv, "--kv-cache-memory-bytes") == [str(regen.CPU_KV_CACHE_BYTES)]
    assert "--gpu-memory-utilization" not in server.argv and "--gpu-memory-utilization" in gpu.argv
    assert dict(server.env) == {} and server.gpus == ()  # no CUDA_VISIBLE_DEVICES on a CPU
    assert any("CPU backend" in note for note in stage_plan(plan, "regen").notes)
    # the in-container client parses what the plan wrote
    from draftscope.pipeline.__main__ import parser

    args = parser().parse_args(list(client[3:]))
    assert args.stage_tiny_target == staged


def test_regen_server_choices_are_checked(monkeypatch, tmp_path):
    with pytest.raises(UserError) as info:
        load_pipeline_config(preset="qwen3-8b", opts=["regen.server=tinyserve"])
    message = info.value.render()
    assert "regen.server" in message and "tinyserve" in message and "fix:" in message
    with pytest.raises(UserError, match=r"regen\.server"):
        load_pipeline_config(preset="tiny", opts=["regen.server=sglang"])
    from draftscope.pipeline.stages import regen

    docker = build("tiny", stage="regen", runtime="docker", opts=["regen.server=vllm"])
    with pytest.raises(UserError, match=r"--runtime local only.*regen.server"):
        regen.check_inputs(docker.context)
    local = build("tiny", stage="regen", runtime="local", opts=["regen.server=vllm"], workdir=str(tmp_path))
    monkeypatch.setattr(regen.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError) as info:
        regen.check_inputs(local.context)
    message = info.value.render()
    assert "vLLM is not installed" in message and "make train-env" in message and "regen.server" in message


def test_the_plan_says_before_training_when_convert_s_mask_probe_will_refuse_the_window():
    """speculators' window counts back from the anchor, SGLang's from each query: served contexts above
    W - B + 1 part (convert/probe.py). The plan says so, with both fixes, before anything trains."""
    preset = load_model_preset("qwen38-27b")
    block = preset.dflash.block_size
    served = preset.serving.context_length or preset.training.seq_length
    window = served - block  # one short of covering the served context
    note = next(n for n in build(opts=[f"train.sliding_window={window}"]).notes if "mask probe" in n)
    assert f"served context {served} > {window - block + 1}" in note
    assert (
        f"train.sliding_window >= {served + block - 1}" in note
        and f"serve.context_length <= {window - block + 1}" in note
    )
    covered = [f"train.sliding_window={served + block - 1}"]
    assert not [n for n in build(opts=covered).notes if "mask probe" in n]
    short = [f"serve.context_length={window - block + 1}", f"train.sliding_window={window}"]
    assert not [n for n in build(opts=short).notes if "mask probe" in n]
    assert not [n for n in build(preset="tiny").notes if "mask probe" in n]
