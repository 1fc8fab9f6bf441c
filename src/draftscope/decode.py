"""The kit's own greedy decode loops for Transformers models (the transformers backend, the tiny models' build):
plain and speculative, batch one. A library: torch and transformers only, imported by the code that runs a model.

Both loops keep a KV cache (`DynamicCache`), take the argmax with ties to the lowest index, and stamp every token
with the time it became available, so `decode_tok_s` is measured for Transformers too. There is no prefix cache
across requests: every call starts from empty caches.

Speculative decoding here is the exact greedy kind: the draft proposes k tokens greedily, the target scores the
pending tokens plus the k proposals in ONE forward pass, the longest prefix of proposals equal to the target's own
argmax is accepted and the target's token at the first disagreement (or after the last proposal) is appended. The
output is therefore token for token the target's plain greedy output; the draft only changes how many target calls
it takes. Every target call is a verification step — the first one also does the prefill — so the acceptance
lengths (tokens emitted per step) add up to the number of generated tokens, and their mean is the tokens per target
call.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from draftscope.core.errors import MissingDependency

try:
    import torch
    from transformers import DynamicCache
except ImportError as exc:  # the host side never imports this module; the transformers image has both
    raise MissingDependency(exc.name or "torch", extra="local", image="transformers") from None

# (logits rows [n, vocab], draft tokens [n - 1]) -> the target's token for every row [n]. A head with
# `needs_hidden = True` (draftscope.head.runtime.CertifiedHead, docs/review/head.md) gets the hidden rows instead, the draft
# tokens, and a callable for the model's own dense head: it certifies rows from a coarse INT8 pass and runs the
# dense head only when it must.
Head = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Clock = Callable[[], float]


@dataclass
class Generation:
    token_ids: list[int]
    token_times: list[float]  # seconds since the request started, when each token became available
    request_seconds: float  # prefill + decode, excluding tokenization
    finish_reason: str  # "eos" | "length" | "fixed_tokens"
    acceptance_lengths: list[int] | None = None  # speculative only: tokens emitted per verification step
    draft_tokens_per_step: int | None = None
    extra: dict[str, Any] | None = None  # backend-specific, into the record's `extra`

    @property
    def target_calls(self) -> int | None:
        return None if self.acceptance_lengths is None else len(self.acceptance_lengths)


def dense_head(rows: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """The reference head: argmax of every row (torch.argmax returns the lowest index on ties)."""
    del draft_tokens  # the dense head looks at every row regardless
    return rows.argmax(dim=-1)


def verify(rows: torch.Tensor, draft_tokens: torch.Tensor, head: Head | None = None) -> tuple[int, int]:
    """Greedy verification of one step: (accepted proposals, the target's next token).

    `rows[i]` is the target's prediction after the i-th proposal (row 0: after the last committed token), so
    there is one row more than proposals. Proposals are accepted while they equal the row's token; the token of
    the first disagreeing row — or of the last row when all are accepted — is the correction/bonus token.
    """
    if rows.shape[0] != draft_tokens.shape[0] + 1:
        raise ValueError(
            f"{rows.shape[0]} logits rows for {draft_tokens.shape[0]} draft tokens; need one more"
        )
    predicted = (head or dense_head)(rows, draft_tokens).tolist()  # one device sync per step
    return _verify_tokens(predicted, draft_tokens.tolist())


def _verify_tokens(predicted: Sequence[int], proposals: Sequence[int]) -> tuple[int, int]:
    accepted = 0
    while accepted < len(proposals) and proposals[accepted] == predicted[accepted]:
        accepted += 1
    return accepted, int(predicted[accepted])


def greedy_generate(
    model: Any,
    input_ids: Sequence[int],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int],
    ignore_eos: bool = False,
    clock: Clock = time.perf_counter,
) -> Generation:
    """Plain greedy decoding with a KV cache; `ignore_eos` generates exactly `max_new_tokens` tokens."""
    _check_args(input_ids, max_new_tokens)
    eos = frozenset(eos_token_ids)
    device = _device(model)
    tokens: list[int] = []
    times: list[float] = []
    finish = "fixed_tokens" if ignore_eos else "length"
    with torch.inference_mode():
        start = clock()
        cache = DynamicCache(config=model.config)
        pending = list(input_ids)
        while True:
            logits = _forward(model, pending, cache, rows=1, device=device)
            token = int(logits[-1].argmax())
            tokens.append(token)
            times.append(clock() - start)
            if not ignore_eos and token in eos:
                finish = "eos"
                break
            if len(tokens) >= max_new_tokens:
                break
            pending = [token]
        request_seconds = clock() - start
    return Generation(tokens, times, request_seconds, finish)


def speculative_generate(
    target: Any,
    draft: Any,
    input_ids: Sequence[int],
    *,
    k: int,
    max_new_tokens: int,
    eos_token_ids: Iterable[int],
    ignore_eos: bool = False,
    clock: Clock = time.perf_counter,
    head: Head | None = None,
) -> Generation:
    """Greedy speculative decoding: the target's greedy output, in fewer target calls.

    Both caches are rolled back (`DynamicCache.crop` with a negative count) to the accepted tokens after every
    step. Tokens emitted by one verification step all carry that step's time.
    """
    _check_args(input_ids, max_new_tokens)
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    eos = frozenset(eos_token_ids)
    device = _device(target)
    draft_device = _device(draft)
    tokens: list[int] = []
    times: list[float] = []
    acceptance: list[int] = []
    finish = "fixed_tokens" if ignore_eos else "length"
    with torch.inference_mode():
        start = clock()
        target_cache = DynamicCache(config=target.config)
        draft_cache = DynamicCache(config=draft.config)
        committed = list(input_ids)  # prompt + emitted tokens
        target_len = draft_len = 0  # tokens held in each cache
        while True:
            # Never propose past the token budget: the step emits at most n_draft + 1 tokens.
            n_draft = min(k, max_new_tokens - len(tokens) - 1)
            proposals: list[int] = []
            pending = committed[draft_len:]
            for _ in range(n_draft):
                logits = _forward(draft, pending, draft_cache, rows=1, device=draft_device)
                draft_len += len(pending)
                proposals.append(int(logits[-1].argmax()))
                pending = proposals[-1:]
            # The draft cache now holds committed + proposals[:-1]; the target sees all proposals at once.
            draft_ids = torch.tensor(proposals, dtype=torch.long, device=device)
            fresh = committed[target_len:] + proposals
            if getattr(head, "needs_hidden", False):
                hidden, dense = _forward_hidden(target, fresh, target_cache, rows=n_draft + 1, device=device)
                accepted, next_token = _verify_tokens(head(hidden, draft_ids, dense).tolist(), proposals)
            else:
                rows = _forward(target, fresh, target_cache, rows=n_draft + 1, device=device)
                accepted, next_token = verify(rows, draft_ids, head)
            target_len = len(committed) + n_draft
            emitted = [*proposals[:accepted], next_token]
            if not ignore_eos:
                stop = next((i for i, t in enumerate(emitted) if t in eos), None)
                if stop is not None:
                    emitted = emitted[: stop + 1]
                    finish = "eos"
            now = clock() - start
            tokens.extend(emitted)
            times.extend([now] * len(emitted))
            acceptance.append(len(emitted))
            if finish == "eos" or len(tokens) >= max_new_tokens:
                break
            # Roll both caches back to committed + accepted proposals; the next token is pending for both.
            keep = len(committed) + accepted
            target_len = _crop(target_cache, target_len, keep)
            draft_len = _crop(draft_cache, draft_len, keep)
            committed.extend(emitted)
        request_seconds = clock() - start
    return Generation(tokens, times, request_seconds, finish, acceptance, k)


def _forward(
    model: Any, token_ids: list[int], cache: Any, *, rows: int, device: torch.device
) -> torch.Tensor:
    """Run `token_ids` through `model` on top of `cache`; the logits of the last `rows` positions, [rows, vocab]."""
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=rows, **{_cache_kwarg(model): cache})
    return out.logits[0, -rows:]


def _forward_hidden(
    model: Any, token_ids: list[int], cache: Any, *, rows: int, device: torch.device
) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
    """The decoder's last hidden states for the last `rows` positions [rows, hidden], and a callable that runs the
    model's own head on them exactly as `_forward` does (same op, same [1, rows, hidden] shape), so a fallback to
    the dense head reproduces a dense run's logits bit for bit."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    out = body(input_ids=ids, use_cache=True, **{_cache_kwarg(body): cache})
    last = out.last_hidden_state[:, -rows:, :]
    return last[0], lambda: model.lm_head(last)[0]


@functools.cache
def _cache_kwarg_of(forward: Any) -> str:
    # transformers 5.24 renamed `past_key_values` to `cache` (the old name warns, and goes in 5.40); the images
    # may pin an earlier 5.x that knows only the old name.
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _cache_kwarg(model: Any) -> str:
    return _cache_kwarg_of(type(model).forward)


def _crop(cache: Any, length: int, keep: int) -> int:
    """Drop cached positions past `keep` (transformers 5.x: a negative count removes that many from the end)."""
    if length > keep:
        cache.crop(keep - length)
        return keep
    return length


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _check_args(input_ids: Sequence[int], max_new_tokens: int) -> None:
    if len(input_ids) == 0:
        raise ValueError("input_ids is empty: a prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1 (got {max_new_tokens})")
