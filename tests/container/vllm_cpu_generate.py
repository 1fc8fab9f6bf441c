"""Greedy generation with the real vLLM engine on the CPU, run the same way in the vllm-cpu image and on the host's
CPU engine environment (`.venv-train`) by tests/container/test_vllm_cpu_image.py, which compares the two.

    python vllm_cpu_generate.py MODEL_DIR OUTPUT_JSON

MODEL_DIR holds the tiny target's config and weights with the tokenizer files beside them. OUTPUT_JSON gets the
versions the engine ran with and, per prompt, the prompt's token ids and the generated ones. Fixed-length greedy
decoding (EOS ignored) so that both runs produce the same number of tokens to compare.
"""

from __future__ import annotations

import json
import sys
import time

# Prompts on which the tiny target's greedy continuation varies (many distinct tokens), so that agreement between two
# runs means something: an engine that loaded the weights wrongly tends to repeat one token.
PROMPTS = (
    "import os\nimport sys\n\n\ndef main(argv",
    "def _check_name(name):\n    if not isinstance(name, str):\n        raise ",
    '"""Helpers for reading',
)
MAX_TOKENS = 24


def main(model: str, output: str) -> None:
    # Imported here: the engine core is a spawned process that re-imports this module, and must not start vLLM again.
    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    start = time.monotonic()
    llm = LLM(
        model=model,
        dtype="bfloat16",
        max_model_len=256,
        enforce_eager=True,
        enable_prefix_caching=False,
        seed=0,
    )
    loaded = time.monotonic() - start
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(list(PROMPTS), params)
    result = {
        "versions": {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "device": current_platform.device_type,
        "load_seconds": round(loaded, 1),
        "generate_seconds": round(time.monotonic() - start - loaded, 1),
        "outputs": [
            {"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
            for o in outputs
        ],
    }
    with open(output, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
