"""The vLLM side of hidden-state extraction: the names vLLM's pinned release uses for it, the two JSON
configurations the kit passes to `vllm serve`, and the check the in-container runner makes of them against the
model it serves (shared by the stage's plan, `__init__.py`, and its runner, `runner.py`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# vLLM's hidden-state extraction, named as its pinned source (0.33.0) names it; each name is checked against that
# wheel by tests/contract/test_hsextract_vllm_launch.py. A misspelt one is no error at startup for some of them
# (an unknown extra-config key falls back to the connector's default `/tmp`), hence the contract test.
VLLM_CLI = "vllm.entrypoints.cli.main"  # `python -m` it: `vllm serve` without relying on the console script
EXTRACT_METHOD = "extract_hidden_states"  # a SpeculativeMethod (vllm/config/speculative.py)
LAYER_IDS_KEY = "eagle_aux_hidden_state_layer_ids"  # the method reads it from draft_model_config.hf_config
CONNECTOR = "ExampleHiddenStatesConnector"  # registered in vLLM's KVConnectorFactory
KV_ROLE = "kv_producer"  # vLLM's KVProducer role: this engine writes, nothing reads back
STORAGE_PATH_KEY = "shared_storage_path"  # the connector's folder, from kv_connector_extra_config


def speculative_config(layer_ids: Sequence[int], num_layers: int) -> dict[str, Any]:
    """vLLM's `--speculative-config` for extraction: capture the hidden states at `layer_ids` (speculators'
    indices, `speculators_layer_ids`) and the final layer's, index `num_layers`, appended unless already there —
    the rule of speculators' launcher (`--include-last-layer`, on by default). One speculative token: the method
    drafts nothing, it only records."""
    ids = [*layer_ids] if num_layers in layer_ids else [*layer_ids, num_layers]
    return {
        "method": EXTRACT_METHOD,
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {LAYER_IDS_KEY: ids}},
    }


def kv_transfer_config(storage_path: str) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for extraction: the hidden-states connector writes one safetensors file per
    request under `storage_path`, and speculators' client moves it into the output folder."""
    return {
        "kv_connector": CONNECTOR,
        "kv_role": KV_ROLE,
        "kv_connector_extra_config": {STORAGE_PATH_KEY: storage_path},
    }


def captured_layers(argv: Sequence[str]) -> list[int] | None:
    """The layer indices a planned extraction server captures (its `--speculative-config`), None for another argv."""
    argv = list(argv)
    if "--speculative-config" not in argv:
        return None
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    if config.get("method") != EXTRACT_METHOD:
        return None
    return list(config["draft_model_config"]["hf_config"][LAYER_IDS_KEY])


def final_layer_problem(layers: Sequence[int], model_config: Mapping[str, Any], model: str) -> str | None:
    """The last captured index is the verifier's final hidden state, index `num_hidden_layers` (speculators'
    convention): the preset's layer count says which, and a wrong one would capture an inner layer as "final"
    without any error downstream. None when the model's own config agrees."""
    config = model_config.get("text_config") or model_config  # multimodal configs nest the text model's
    found = config.get("num_hidden_layers") if isinstance(config, Mapping) else None
    if found == layers[-1]:
        return None
    return (
        f"the plan captures index {layers[-1]} as the final hidden state, but {model}/config.json has"
        f" num_hidden_layers={found!r}"
    )
