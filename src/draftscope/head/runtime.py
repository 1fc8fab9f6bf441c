"""The head as the kit's speculative loop uses it: hidden rows in, the target's token per row out.

`CertifiedHead(weight, policy=…)` is called once per verification step with the step's hidden rows (k proposals
+ the bonus row), the draft tokens, and a callable that runs the model's own dense head on those rows (the same
op, on the same shapes, as a dense run — so a fallback reproduces the dense run's values bit for bit):

- `dense`: the model's head on every step (the baseline; with `capture`, records the calls for `head-study`);
- `rowwise`: the certified head; the dense head whenever any row is uncertified;
- `prefix`: the certified head; the dense head only when an uncertified row lies in the relevant prefix.

`shadow=True` also runs the dense head on every step and counts the steps where the certified result would have
differed from the dense one in accepted tokens, correction token or acceptance length (must stay 0). Counters live
in a device tensor and are read every `read_every` steps (`HeadCounters`), never synchronously per step — the
decode loop itself synchronises once per step to read the tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from draftscope.core.errors import UserError
from draftscope.head.certify import DEFAULT_K, NO_DRAFT, certify
from draftscope.head.cpu_coarse import Int8Coarse
from draftscope.head.policy import prefix_decision, rowwise_decision, verify_tokens
from draftscope.head.quant import QuantizedHead

POLICIES = ("dense", "rowwise", "prefix")
COUNTERS = (
    "calls",
    "rows",
    "certified",
    "uncertified_relevant",
    "uncertified_irrelevant",
    "dense_calls",  # steps where this policy ran the dense head
    "dense_calls_rowwise",  # the same steps under the row-wise rule (for comparison, same calls)
    "dense_calls_prefix",
    "ties",
    "shadow_calls",
    "shadow_disagreements",
)


class HeadCounters:
    """Counters in a device tensor, added to without a sync and read into host integers every N steps."""

    def __init__(self, device: torch.device | str = "cpu", read_every: int = 16) -> None:
        self.values = torch.zeros(len(COUNTERS), dtype=torch.int64, device=device)
        self.host = dict.fromkeys(COUNTERS, 0)
        self.read_every = max(1, read_every)
        self.steps = 0
        self.reads = 0

    def add(self, **increments: torch.Tensor | int) -> None:
        for name, value in increments.items():
            self.values[COUNTERS.index(name)] += value

    def step(self) -> None:
        self.steps += 1
        if self.steps % self.read_every == 0:
            self.read()

    def read(self) -> dict[str, int]:
        for name, value in zip(COUNTERS, self.values.tolist(), strict=True):
            self.host[name] += int(value)
        self.values.zero_()
        self.reads += 1
        return dict(self.host)


@dataclass
class Capture:
    """Verification calls recorded for `head-study`: hidden rows, draft tokens, and the dense outcome."""

    limit: int
    calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, hidden: torch.Tensor, draft: torch.Tensor, dense: torch.Tensor) -> None:
        if len(self.calls) >= self.limit:
            return
        accepted, token = verify_tokens(dense.tolist(), draft.tolist())
        self.calls.append(
            {
                "hidden": hidden.detach().cpu().clone(),
                "draft": draft.detach().cpu().clone(),
                "dense_tokens": dense.detach().cpu().clone(),
                "accepted": accepted,
                "next_token": token,
            }
        )


class CertifiedHead:
    """hidden rows [n, D], draft tokens [n-1], dense() → logits [n, V]  ⟶  tokens [n]."""

    needs_hidden = True

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        policy: str = "prefix",
        k: int = DEFAULT_K,
        group_size: int | None = None,
        out_dtype: torch.dtype | None = None,
        shadow: bool = False,
        read_every: int = 16,
        capture: Capture | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown head policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.k = k
        self.shadow = shadow
        self.capture = capture
        self.out_dtype = out_dtype or weight.dtype
        self.quantized = QuantizedHead.build(weight, group_size) if policy != "dense" else None
        # On a CPU the coarse pass runs INT8 × INT8 (`cpu_coarse`) where that kernel is exact here.
        q = self.quantized
        self.int8 = Int8Coarse.build(q) if q is not None and Int8Coarse.available(q) else None
        self.counters = HeadCounters(weight.device, read_every)
        self.seconds = {"certify": 0.0, "dense": 0.0}

    def __call__(
        self, hidden: torch.Tensor, draft: torch.Tensor, dense: Callable[[], torch.Tensor]
    ) -> torch.Tensor:
        n = hidden.shape[0]
        rows_draft = torch.cat([draft.to(torch.long), torch.tensor([NO_DRAFT], device=draft.device)])
        if self.policy == "dense":
            tokens = self._dense(dense)
            if self.capture is not None:
                self.capture.add(hidden, draft, tokens)
            self.counters.add(calls=1, rows=n, dense_calls=1)
            self.counters.step()
            return tokens
        started = time.perf_counter()
        assert self.quantized is not None
        bounds = self.int8.coarse(hidden) if self.int8 is not None else None
        cert = certify(self.quantized, hidden, rows_draft, k=self.k, out_dtype=self.out_dtype, bounds=bounds)
        request = torch.zeros(n, dtype=torch.long, device=hidden.device)
        prefix = prefix_decision(cert.certified, cert.tokens, rows_draft, request, requests=1)
        rowwise = rowwise_decision(cert.certified, request, requests=1)
        need = prefix.need_dense if self.policy == "prefix" else rowwise.need_dense
        self.seconds["certify"] += time.perf_counter() - started
        self.counters.add(
            calls=1,
            rows=n,
            certified=cert.certified.sum(),
            uncertified_relevant=(prefix.relevant & ~cert.certified).sum(),
            uncertified_irrelevant=(~prefix.relevant & ~cert.certified).sum(),
            dense_calls=need.to(torch.int64),
            dense_calls_rowwise=rowwise.need_dense.to(torch.int64),
            dense_calls_prefix=prefix.need_dense.to(torch.int64),
            ties=(cert.ties * cert.certified).sum(),
        )
        reference = self._dense(dense) if (self.shadow or self.capture is not None) else None
        tokens = cert.tokens
        if bool(need):  # the one host sync of the step: whether to run the dense head
            tokens = reference if reference is not None else self._dense(dense)
        if reference is not None and self.shadow:
            differs = verify_tokens(tokens.tolist(), draft.tolist()) != verify_tokens(
                reference.tolist(), draft.tolist()
            )
            self.counters.add(shadow_calls=1, shadow_disagreements=int(differs))
        if self.capture is not None and reference is not None:
            self.capture.add(hidden, draft, reference)
        self.counters.step()
        return tokens

    def _dense(self, dense: Callable[[], torch.Tensor]) -> torch.Tensor:
        started = time.perf_counter()
        tokens = dense().argmax(dim=-1)
        self.seconds["dense"] += time.perf_counter() - started
        return tokens

    def report(self) -> dict[str, Any]:
        """The counters (read now) and per-phase seconds, for the run's records."""
        counts = self.counters.read()
        return {
            "policy": self.policy,
            "k": self.k,
            "shadow": self.shadow,
            **counts,
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
        }


def check_dense_head(model: Any) -> None:
    """The exactness preconditions on the model's head (docs/review/head.md): a plain linear map — no bias, no logit soft-cap
    or scale. A model that breaks one is refused with the reason, never run with a head that would not be exact."""
    head = getattr(model, "lm_head", None)
    if head is None or getattr(head, "weight", None) is None:
        raise UserError(
            "the target has no lm_head weight to certify",
            field="head.policy",
            fix="use --head dense for this model",
        )
    if getattr(head, "bias", None) is not None:
        raise UserError(
            "the target's head has a bias; the bounds assume none",
            field="head.policy",
            fix="use --head dense for this model",
        )
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
        value = getattr(config, name, None)
        if value not in (None, 0, 1, 1.0):
            raise UserError(
                f"the target scales or caps its logits ({name}={value}); the bounds assume neither",
                field="head.policy",
                fix="use --head dense for this model",
            )
