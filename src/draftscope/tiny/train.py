"""Training and measuring the tiny models: seeded, fixed step counts, deterministic on one machine.

Nothing here depends on the wall clock: the step counts fix the work, so a rebuild with the same settings, Python
(corpus), torch version and CPU reproduces the weights bit for bit (measured: docs/develop/upstream-facts.md, the tiny models). Training runs in fp32;
the build stores bf16.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from draftscope.decode import speculative_generate

Progress = Callable[[str, int, int, float], None]  # (phase, step, steps, loss)


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    seed: int
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.05
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Draft only: weight of the KL term towards the target's next-token distribution (the rest is plain
    # cross-entropy on the text).
    distil_weight: float = 0.0


@contextlib.contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """Fixed thread count and deterministic kernels for the duration; the previous settings come back after."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.set_num_threads(old_threads)


def token_stream(tokenizer: Any, texts: Sequence[str], separator: int) -> torch.Tensor:
    """All texts encoded and concatenated, each followed by `separator` (`<|endoftext|>`)."""
    ids: list[int] = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids.extend(enc.ids)
        ids.append(separator)
    return torch.tensor(ids, dtype=torch.long)


def _batches(stream: torch.Tensor, settings: TrainSettings) -> Iterator[torch.Tensor]:
    """Random windows of seq_len + 1 tokens, their offsets drawn from a generator seeded by `settings.seed`."""
    generator = torch.Generator().manual_seed(settings.seed)
    span = settings.seq_len + 1
    offsets = torch.arange(span)
    while True:
        starts = torch.randint(0, stream.numel() - span, (settings.batch_size, 1), generator=generator)
        yield stream[starts + offsets]


def _lr_at(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio of the peak."""
    warmup = max(1, int(settings.steps * settings.warmup_fraction))
    if step < warmup:
        return settings.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return settings.lr * (settings.min_lr_ratio + (1 - settings.min_lr_ratio) * cosine)


def train(
    model: Any,
    stream: torch.Tensor,
    settings: TrainSettings,
    *,
    teacher: Any = None,
    phase: str = "train",
    progress: Progress | None = None,
) -> dict[str, float]:
    """Train `model` for exactly `settings.steps` AdamW steps; with a `teacher`, distil its next-token distribution.

    Returns the mean loss of the last 10% of steps and the seconds taken.
    """
    model.train()
    if teacher is not None:
        teacher.eval()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": settings.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=settings.lr,
        betas=(0.9, 0.95),
    )
    vocab = model.config.vocab_size
    tail: list[float] = []
    tail_from = int(settings.steps * 0.9)
    start = time.perf_counter()
    batches = _batches(stream, settings)
    for step in range(settings.steps):
        window = next(batches)
        inputs, labels = window[:, :-1], window[:, 1:]
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, settings)
        logits = model(input_ids=inputs, use_cache=False).logits.reshape(-1, vocab)
        loss = F.cross_entropy(logits, labels.reshape(-1))
        if teacher is not None and settings.distil_weight > 0:
            with torch.no_grad():
                teacher_logits = teacher(input_ids=inputs, use_cache=False).logits.reshape(-1, vocab)
            kl = F.kl_div(
                F.log_softmax(logits, dim=-1),
                F.log_softmax(teacher_logits, dim=-1),
                log_target=True,
                reduction="batchmean",
            )
            loss = settings.distil_weight * kl + (1 - settings.distil_weight) * loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        value = loss.detach().item()
        if step >= tail_from:
            tail.append(value)
        if progress is not None:
            progress(phase, step + 1, settings.steps, value)
    model.eval()
    return {"final_loss": sum(tail) / max(1, len(tail)), "seconds": time.perf_counter() - start}


def evaluate(
    model: Any, stream: torch.Tensor, *, seq_len: int = 128, max_windows: int = 256, batch_size: int = 32
) -> dict[str, float]:
    """Validation loss and confidence over non-overlapping windows spread through the held-out stream.

    `mean_top1_prob` is the mean over positions of the largest next-token probability: how peaked the target's
    distribution is, which bounds how often any draft can agree with it.
    """
    span = seq_len + 1
    available = stream.numel() // span
    count = min(max_windows, available)
    # Evenly spread over the held-out files rather than the first few of them.
    picks = torch.arange(count) * (available // count)
    windows = stream[: available * span].reshape(available, span)[picks]
    total_loss = total_top1 = total_over_half = 0.0
    positions = 0
    with torch.inference_mode():
        for i in range(0, count, batch_size):
            chunk = windows[i : i + batch_size]
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
            logits = logits.reshape(-1, logits.shape[-1])
            labels = chunk[:, 1:].reshape(-1)
            total_loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            top1 = logits.softmax(dim=-1).max(dim=-1).values
            total_top1 += float(top1.sum())
            total_over_half += float((top1 > 0.5).sum())
            positions += labels.numel()
    loss = total_loss / positions
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "mean_top1_prob": total_top1 / positions,
        "top1_over_half": total_over_half / positions,
        "positions": positions,
    }


def tokens_per_target_call(
    target: Any, draft: Any, prompts: Sequence[Sequence[int]], *, k: int, max_new_tokens: int
) -> dict[str, float]:
    """Greedy speculative decoding over `prompts` (EOS ignored): generated tokens / target calls, all prompts."""
    tokens = calls = 0
    for prompt in prompts:
        gen = speculative_generate(
            target, draft, prompt, k=k, max_new_tokens=max_new_tokens, eos_token_ids=(), ignore_eos=True
        )
        tokens += len(gen.token_ids)
        calls += len(gen.acceptance_lengths or ())
    return {"tokens_per_target_call": tokens / calls, "tokens": tokens, "target_calls": calls}


def heldout_prompts(stream: torch.Tensor, *, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens, evenly spaced through the held-out stream."""
    step = (stream.numel() - length) // count
    return [stream[i * step : i * step + length].tolist() for i in range(count)]
