"""When the dense head must run: the prefix rule, and the row-wise rule it is compared with (docs/review/head.md).

Rows come grouped by request, in order: a request's rows are its k verification rows and the bonus row (draft
token −1). Per request, the prefix rule walks its rows: an uncertified row needs the dense head; a certified row
equal to its draft token is accepted and the walk goes on; a certified mismatch, or the bonus row, ends the walk —
rows after it are irrelevant whatever their status. An ineligible request (penalties, grammar, logprobs,
non-greedy sampling …) always needs the dense head. The row-wise rule needs the dense head when any row of an
eligible request is uncertified. Either way, `need_dense` is the OR over requests: one dense pass serves all rows.

Everything here is tensor arithmetic without a host synchronisation, so it can run inside a captured graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Decision:
    need_dense: torch.Tensor  # bool scalar (the OR over requests)
    request_dense: torch.Tensor  # bool [R]
    relevant: torch.Tensor  # bool [N]: rows the prefix walk reaches (up to and including where it stops)
    trigger: torch.Tensor  # long [R]: the row (index into N) that made the request need the dense head, or -1


def prefix_decision(
    certified: torch.Tensor,
    tokens: torch.Tensor,
    draft: torch.Tensor,
    request: torch.Tensor,
    eligible: torch.Tensor | None = None,
    requests: int | None = None,
) -> Decision:
    """The prefix rule over rows [N] of R requests (`request[i]` ∈ 0..R-1, non-decreasing). Pass `requests` (R)
    to keep it free of host synchronisation."""
    n = certified.shape[0]
    requests = requests if requests is not None else (int(request.max().item()) + 1 if n else 0)
    eligible = (
        eligible if eligible is not None else torch.ones(requests, dtype=torch.bool, device=certified.device)
    )
    goes_on = certified & (draft >= 0) & (tokens == draft)
    # Within each request: a row is relevant iff every earlier row of the request goes on.
    start = _request_starts(request, requests)
    blocked = (~goes_on).to(torch.int64)
    before = torch.cumsum(blocked, 0) - blocked  # blocked rows before i, over the whole batch
    # A request without rows (a graph bucket's padding request when no row pads) starts at n: read a zero there.
    at_start = torch.cat([before, before.new_zeros(1)])[start][request]
    relevant = (before - at_start) == 0
    uncertified_relevant = relevant & ~certified
    request_uncertain = torch.zeros(requests, dtype=torch.bool, device=certified.device)
    request_uncertain.index_put_((request,), uncertified_relevant, accumulate=True)
    request_dense = request_uncertain | ~eligible
    rows = torch.arange(n, device=certified.device)
    trigger = torch.full((requests,), n, dtype=torch.long, device=certified.device)
    trigger.scatter_reduce_(0, request, torch.where(uncertified_relevant, rows, n), reduce="amin")
    trigger = torch.where(trigger == n, -1, trigger)
    return Decision(request_dense.any(), request_dense, relevant, trigger)


def rowwise_decision(
    certified: torch.Tensor,
    request: torch.Tensor,
    eligible: torch.Tensor | None = None,
    requests: int | None = None,
) -> Decision:
    """The row-wise rule: any uncertified row of a request needs the dense head."""
    n = certified.shape[0]
    requests = requests if requests is not None else (int(request.max().item()) + 1 if n else 0)
    eligible = (
        eligible if eligible is not None else torch.ones(requests, dtype=torch.bool, device=certified.device)
    )
    uncertain = torch.zeros(requests, dtype=torch.bool, device=certified.device)
    uncertain.index_put_((request,), ~certified, accumulate=True)
    rows = torch.arange(n, device=certified.device)
    trigger = torch.full((requests,), n, dtype=torch.long, device=certified.device)
    trigger.scatter_reduce_(0, request, torch.where(~certified, rows, n), reduce="amin")
    trigger = torch.where(trigger == n, -1, trigger)
    request_dense = uncertain | ~eligible
    return Decision(request_dense.any(), request_dense, torch.ones_like(certified), trigger)


def _request_starts(request: torch.Tensor, requests: int) -> torch.Tensor:
    """The first row of each request."""
    n = request.shape[0]
    starts = torch.full((requests,), n, dtype=torch.long, device=request.device)
    starts.scatter_reduce_(0, request, torch.arange(n, device=request.device), reduce="amin")
    return starts


def verify_tokens(tokens: list[int], draft: list[int]) -> tuple[int, int]:
    """Greedy verification of one request's rows: (accepted proposals, correction or bonus token)."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == tokens[accepted]:
        accepted += 1
    return accepted, int(tokens[accepted])
