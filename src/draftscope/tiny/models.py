"""The geometry of the tiny target and draft: both Qwen3, sharing the tokenizer's 4096-token vocabulary.

The numbers here are the ones `presets/models/tiny.yaml` states under `architecture` and `kit_model`; a unit test
keeps the two in agreement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from draftscope.tiny.tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

MAX_POSITIONS = 512
ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class Geometry:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


# ~2.0M parameters with tied embeddings (0.79M of them in the embedding).
TARGET = Geometry(
    hidden_size=192,
    num_layers=3,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=48,
)
# ~0.33M parameters: cheap enough that drafting 4 tokens costs less than one target pass.
DRAFT = Geometry(
    hidden_size=64,
    num_layers=1,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
)


def qwen3_config(geometry: Geometry, *, initializer_range: float = 0.02) -> Any:
    """A `Qwen3Config` for `geometry`: tied embeddings, no sliding window, special-token ids of the tokenizer."""
    # lazy: transformers; `draftscope.tiny` imports without it
    from transformers import Qwen3Config

    endoftext, _im_start, im_end, _mask = range(len(SPECIAL_TOKENS))
    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=geometry.hidden_size,
        intermediate_size=geometry.intermediate_size,
        num_hidden_layers=geometry.num_layers,
        num_attention_heads=geometry.num_attention_heads,
        num_key_value_heads=geometry.num_key_value_heads,
        head_dim=geometry.head_dim,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
    )


def new_model(geometry: Geometry, *, seed: int, initializer_range: float = 0.02) -> Any:
    """A freshly initialised `Qwen3ForCausalLM` (fp32), its weights fixed by `seed`."""
    # lazy: torch and transformers; `draftscope.tiny` imports without them
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(geometry, initializer_range=initializer_range))
    return model.float()


def parameter_count(model: Any) -> int:
    """Unique parameters (the tied output head counted once)."""
    seen = {id(p): p.numel() for p in model.parameters()}
    return sum(seen.values())


def geometry_dict(geometry: Geometry) -> dict[str, int]:
    return asdict(geometry)
