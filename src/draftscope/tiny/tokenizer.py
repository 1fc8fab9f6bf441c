"""The tiny models' tokenizer: byte-level BPE (vocabulary 4096) with Qwen-style chat tokens and template.

Trained with `tokenizers` on the training split only, then wrapped as a transformers fast tokenizer and saved so
that `AutoTokenizer.from_pretrained(folder)` loads it offline, chat template included.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

VOCAB_SIZE = 4096
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Never seen in training: a placeholder the DFlash draft puts in the positions it predicts (the preset's
# dflash.mask_token_id).
MASK = "<|mask|>"
# Fixed order, so ids 0..3 are the special tokens in every build.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)

# Qwen's layout: `<|im_start|>role\ncontent<|im_end|>\n` per message; the generation prompt opens the
# assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts` (deterministic for the same texts)."""
    # lazy: tokenizers, only when a tokenizer is trained
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is a token, so any text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap(tok: Any) -> Any:
    """The transformers tokenizer around a trained `tokenizers.Tokenizer`, chat template attached."""
    # lazy: transformers, only when a trained tokenizer is wrapped
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, MASK],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(fast: Any, folder: Path) -> None:
    fast.save_pretrained(str(folder))


def special_token_ids(fast: Any) -> dict[str, int]:
    return {t: fast.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
