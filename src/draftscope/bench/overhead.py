"""What the harness's timing instrumentation costs: the kit's greedy loop (a timestamp per token) against the
same loop without any timing, and against `model.generate`, on the tiny model, interleaved in one run.

Printed as ratios of median request times; the goal is under 1% added by the instrumentation. Runs in-process
(`--runtime local` semantics): it measures the loop, not the container.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from draftscope.bench.backends.common import need


@dataclass(frozen=True)
class OverheadResult:
    tokens: int
    rounds: int
    kit_s: float  # median request seconds, kit loop (timestamps on)
    bare_s: float  # median request seconds, the same loop with no timing at all
    generate_s: float  # median request seconds, transformers' model.generate
    clock_ns: float  # cost of one perf_counter() call, measured

    @property
    def kit_over_bare(self) -> float:
        return self.kit_s / self.bare_s

    @property
    def kit_over_generate(self) -> float:
        return self.kit_s / self.generate_s


def _bare_loop(model, input_ids: Sequence[int], tokens: int) -> list[int]:
    """The kit's loop with every timing call removed: the floor the instrumentation is judged against."""
    torch = need("torch")
    # lazy: transformers and torch, only when the overhead is measured
    from transformers import DynamicCache

    from draftscope.decode import _device, _forward

    device = _device(model)
    out: list[int] = []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        pending = list(input_ids)
        while len(out) < tokens:
            logits = _forward(model, pending, cache, rows=1, device=device)
            token = int(logits[-1].argmax())
            out.append(token)
            pending = [token]
    return out


def _generate(model, input_ids: Sequence[int], tokens: int) -> list[int]:
    torch = need("torch")
    ids = torch.tensor([list(input_ids)], device=next(model.parameters()).device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            do_sample=False,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            attention_mask=torch.ones_like(ids),
        )
    return out[0, ids.shape[1] :].tolist()


def measure(model, prompts: Sequence[Sequence[int]], *, tokens: int = 64, rounds: int = 5) -> OverheadResult:
    # lazy: torch and transformers, only when the overhead is measured
    from draftscope.decode import greedy_generate

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    kit, bare, gen = [], [], []
    for ids in prompts:  # warm-up, and a check that all three produce the same tokens
        a = greedy_generate(model, ids, max_new_tokens=tokens, eos_token_ids=(), ignore_eos=True).token_ids
        b = _bare_loop(model, ids, tokens)
        if a != b:
            raise AssertionError(
                "the kit loop and the bare loop disagree; the comparison would be meaningless"
            )
        _generate(model, ids, tokens)
    for _ in range(rounds):
        for ids in prompts:  # interleaved, so drift and noise hit all three alike
            kit.append(
                timed(
                    lambda ids=ids: greedy_generate(
                        model, ids, max_new_tokens=tokens, eos_token_ids=(), ignore_eos=True
                    )
                )
            )
            bare.append(timed(lambda ids=ids: _bare_loop(model, ids, tokens)))
            gen.append(timed(lambda ids=ids: _generate(model, ids, tokens)))
    n = 200_000
    start = time.perf_counter_ns()
    for _ in range(n):
        time.perf_counter()
    clock_ns = (time.perf_counter_ns() - start) / n
    return OverheadResult(
        tokens, rounds, statistics.median(kit), statistics.median(bare), statistics.median(gen), clock_ns
    )


def report_lines(result: OverheadResult) -> list[str]:
    added = (result.kit_over_bare - 1) * 100
    return [
        f"tiny target, {result.tokens} tokens per request, {result.rounds} interleaved rounds, median request time:",
        f"  kit loop (timestamp per token)   {result.kit_s * 1e3:9.2f} ms",
        f"  bare loop (no timing)            {result.bare_s * 1e3:9.2f} ms",
        f"  transformers model.generate      {result.generate_s * 1e3:9.2f} ms",
        f"  kit / bare      = {result.kit_over_bare:.4f}  ({added:+.2f}% added by the instrumentation; goal < 1%)",
        f"  kit / generate  = {result.kit_over_generate:.4f}",
        f"  one perf_counter() call = {result.clock_ns:.0f} ns "
        f"({result.clock_ns * result.tokens / 1e6:.4f} ms per request of {result.tokens} tokens)",
    ]
