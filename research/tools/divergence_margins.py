"""Why two greedy runs of the tiny target part ways: the logit margin at each first divergence.

    python research/tools/divergence_margins.py BASE_RUN CANDIDATE_RUN [--output FILE]

For every prompt the two run directories share (joined on the prompt hash, first repeat of each), find the first
position where their generated token ids differ. Then score the shared prefix (the chat-templated prompt + the
tokens both runs agree on) with the shipped tiny target through Transformers, by teacher forcing, in float32 and in
bfloat16, and report at that position: both runs' tokens, the logit of each, their margin, the float32 argmax, and
the bfloat16 rounding step of the logits there (the spacing of bfloat16 numbers at the larger logit's magnitude,
2 ** (floor(log2 |x|) - 7)). A margin of the order of that step is a near-tie that the rounding of a different
kernel or batch shape can flip (numerics); a margin far above it would be a real loss of exactness.

It works on the tiny preset only (the model it scores with is the kit's shipped tiny target, hash-checked) and
needs the kit's `local` extra (torch, transformers). The result is JSON on stdout, or in FILE (never overwritten).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from draftscope.core.jsonio import read_json


def _records(run: Path) -> dict[str, dict[str, Any]]:
    first: dict[str, dict[str, Any]] = {}
    for line in (run / "records.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("repeat", 0) == 0 and "generated_token_ids" in rec:
                first.setdefault(rec["prompt_sha256"], rec)
    return first


def _prompts(run: Path) -> dict[str, list[dict[str, str]]]:
    doc = read_json(run / "inputs" / "prompts.json")
    return {p["id"]: p["messages"] for p in doc["prompts"]}


def _bf16_step(x: float) -> float:
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 0.0


def margins(base: Path, candidate: Path) -> dict[str, Any]:
    import torch

    from draftscope.tiny import assets

    tokenizer = assets.load_tokenizer()
    models = {name: assets.load_target(dtype=name) for name in ("float32", "bfloat16")}
    b, c = _records(base), _records(candidate)
    messages = _prompts(base)
    rows = []
    for key, rb in b.items():
        rc = c.get(key)
        if rc is None:
            continue
        tb, tc = rb["generated_token_ids"], rc["generated_token_ids"]
        pos = next((i for i, (x, y) in enumerate(zip(tb, tc, strict=False)) if x != y), None)
        row: dict[str, Any] = {"prompt_id": rb["prompt_id"], "compared": min(len(tb), len(tc))}
        if pos is None:
            row["first_divergence"] = None
            rows.append(row)
            continue
        encoded = tokenizer.apply_chat_template(
            messages[rb["prompt_id"]], add_generation_prompt=True, tokenize=True
        )
        prompt = [int(i) for i in getattr(encoded, "input_ids", encoded)]
        if len(prompt) != rb["prompt_tokens"]:
            raise SystemExit(
                f"{rb['prompt_id']}: the prompt encodes to {len(prompt)} tokens here, the run recorded "
                f"{rb['prompt_tokens']}: not the same tokenizer or template"
            )
        ids = torch.tensor([prompt + tb[:pos]])
        row["first_divergence"] = pos
        row["base_token"], row["candidate_token"] = tb[pos], tc[pos]
        for name, model in models.items():
            with torch.no_grad():
                logits = model(ids).logits[0, -1].float()
            lb, lc = float(logits[tb[pos]]), float(logits[tc[pos]])
            top2 = torch.topk(logits, 2)
            row[name] = {
                "base_logit": lb,
                "candidate_logit": lc,
                "margin": lb - lc,
                "argmax": int(top2.indices[0]),
                "top2_gap": float(top2.values[0] - top2.values[1]),
                "bf16_step": _bf16_step(max(abs(lb), abs(lc))),
            }
        rows.append(row)
    return {
        "base": str(base),
        "candidate": str(candidate),
        "prompts": len(rows),
        "diverged": sum(1 for r in rows if r["first_divergence"] is not None),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    text = json.dumps(margins(args.base, args.candidate), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        with open(args.output, "x", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
