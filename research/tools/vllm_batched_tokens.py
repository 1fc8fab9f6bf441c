"""vLLM's CPU engine, all prompts in one batch: plain and speculative (the tiny draft, draft_model) greedy tokens.

    python research/tools/vllm_batched_tokens.py PROMPTS.json --dtype bfloat16 --output FILE [--draft-tokens 4]

The kit's benchmarks run one request at a time. This asks the other question of the vllm-cpu-exactness study's
follow-up: with every prompt submitted together through `vllm.LLM.generate` (the engine batches them, so the
shapes of each step's matrix products differ from batch one), do speculative and plain decoding still give the same
greedy tokens? It loads the shipped tiny target (and, for the speculative pass, the tiny draft) staged beside the
tokenizer files (`tiny.stage_for_vllm`), in eager mode, prefix caching off unless --prefix-caching, and writes per prompt the token ids
of both passes and their first divergence. Needs the CPU engine environment (`make train-env`); FILE is never
overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _generate(
    model: Path, draft: Path | None, k: int, dtype: str, prompts: list[list[int]], n: int, caching: bool
) -> list:
    from vllm import LLM, SamplingParams, TokensPrompt

    kwargs: dict[str, Any] = {
        "model": str(model),
        "dtype": dtype,
        "max_model_len": 512,
        "enforce_eager": True,
        "enable_prefix_caching": caching,
        "seed": 0,
    }
    if draft is not None:
        kwargs["speculative_config"] = {
            "method": "draft_model",
            "model": str(draft),
            "num_speculative_tokens": k,
        }
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=n, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    return tokens


def main(argv: list[str] | None = None) -> int:
    from draftscope.tiny import assets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prefix-caching", action="store_true", help="vLLM's default (the kit turns it off)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    doc = json.loads(args.prompts.read_text(encoding="utf-8"))
    tokenizer = assets.load_tokenizer()
    ids, names = [], []
    for prompt in doc["prompts"]:
        encoded = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=True)
        ids.append([int(i) for i in getattr(encoded, "input_ids", encoded)])
        names.append(prompt["id"])
    with tempfile.TemporaryDirectory() as tmp:
        target = assets.stage_for_vllm(Path(tmp) / "target", "target")
        draft = assets.stage_for_vllm(Path(tmp) / "draft", "draft")
        plain = _generate(target, None, 0, args.dtype, ids, args.max_new_tokens, args.prefix_caching)
        spec = _generate(
            target, draft, args.draft_tokens, args.dtype, ids, args.max_new_tokens, args.prefix_caching
        )
    rows = []
    for name, p, s in zip(names, plain, spec, strict=True):
        pos = next((i for i, (a, b) in enumerate(zip(p, s, strict=False)) if a != b), None)
        if pos is None and len(p) != len(s):
            pos = min(len(p), len(s))
        rows.append({"prompt_id": name, "plain": p, "speculative": s, "first_divergence": pos})
    result = {
        "dtype": args.dtype,
        "batch": len(ids),
        "draft_tokens": args.draft_tokens,
        "max_new_tokens": args.max_new_tokens,
        "prefix_caching": args.prefix_caching,
        "diverged": sum(1 for r in rows if r["first_divergence"] is not None),
        "rows": rows,
    }
    with open(args.output, "x", encoding="utf-8") as fh:
        fh.write(json.dumps(result, indent=2) + "\n")
    print(f"{args.dtype}: {result['diverged']} of {len(rows)} prompts differ between plain and speculative")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
