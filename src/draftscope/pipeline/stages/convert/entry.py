"""convert's in-container entry: the arguments the stage passes (`convert/__init__.py`), the expected values built
from them, the target's vocabulary (the mask token's string) and the mask probe (`probe.py`, lazily: it needs torch
and speculators), then `checkpoint.convert`."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from draftscope.core.errors import UserError
from draftscope.pipeline.stages.convert import semantics
from draftscope.pipeline.stages.convert.checkpoint import (
    ARCHITECTURES,
    DFLASH2_KEYS,
    Expected,
    convert,
    pick_epoch,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoints", required=True, help="speculators' --save-path")
    parser.add_argument("--epoch", default="latest")
    parser.add_argument("--output", required=True)
    parser.add_argument("--draft", required=True, choices=sorted(ARCHITECTURES))
    parser.add_argument("--target-layer-ids", type=int, nargs="+", required=True)
    parser.add_argument("--num-target-layers", type=int, required=True)
    parser.add_argument("--num-draft-layers", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--vocab-size", type=int, required=True)
    parser.add_argument("--mask-token-id", type=int, default=None)
    parser.add_argument("--hidden-size", type=int, default=None)
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="the target's tokenizer folder (its tokenizer.json names the mask token)",
    )
    parser.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="the longest context SGLang will serve (the mask probe's range)",
    )
    parser.add_argument(
        "--no-mask-probe",
        action="store_true",
        help="skip the mask probe (it needs torch and speculators): convert.mask_probe=false",
    )
    for key in DFLASH2_KEYS:
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--markov-rank", type=int, default=None)
    parser.add_argument("--markov-head-type", default=None)
    for key in ("enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor"):
        parser.add_argument(f"--{key.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=None)


def expected_from_args(args: argparse.Namespace) -> Expected:
    dflash2 = {k: getattr(args, k) for k in DFLASH2_KEYS} if args.draft == "dflash2" else {}
    dspark = (
        {
            k: getattr(args, k)
            for k in (
                "markov_rank",
                "markov_head_type",
                "enable_confidence_head",
                "confidence_head_with_markov",
                "sample_from_anchor",
            )
        }
        if args.draft == "dspark"
        else {}
    )
    missing = [k for k, v in {**dflash2, **dspark}.items() if v is None]
    if missing:
        raise UserError(f"missing expected values for {args.draft}: {', '.join(missing)}", field="convert")
    return Expected(
        draft=args.draft,
        target_layer_ids=tuple(args.target_layer_ids),
        num_target_layers=args.num_target_layers,
        num_draft_layers=args.num_draft_layers,
        block_size=args.block_size,
        vocab_size=args.vocab_size,
        mask_token_id=args.mask_token_id,
        hidden_size=args.hidden_size,
        dflash2=dflash2,
        dspark=dspark,
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    expected = expected_from_args(args)
    if args.tokenizer:
        expected = replace(expected, vocab=semantics.read_vocab(Path(args.tokenizer)))
    checkpoint = pick_epoch(Path(args.checkpoints), args.epoch)
    probe = None
    if not args.no_mask_probe:
        from draftscope.pipeline.stages.convert import probe as mask_probe

        max_context = args.max_context

        def probe(source: Path, written: Mapping[str, Any]) -> list[dict[str, Any]]:
            return mask_probe.run(source, written, max_context=max_context)

    report = convert(checkpoint, Path(args.output), expected, probe=probe)
    probed = sum(row["field"].startswith("probe:") for row in report["checks"])
    return {"checks": len(report["checks"]), "epoch": int(checkpoint.name), "mask_probe_checks": probed}
