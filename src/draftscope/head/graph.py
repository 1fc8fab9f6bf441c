"""The device-side branch (GPU only): the whole certified head, and the dense fallback, with no host sync.

Two designs, both captured as CUDA graphs, one graph per padded row-count bucket (1, 2, 4, …, 64 rows), each warmed
up once before capture (cuBLAS handles, workspaces and Triton JIT must exist before capture — a first use inside
capture fails):

- `ConditionalHead` (the design): coarse pass → candidates → refine → certify → prefix rule write the certified
  tokens and a 0-dim bool `need_dense`; a CUDA conditional IF node (`CUDAGraph.begin_capture_to_if_node`, CUDA ≥
  12.4) holds the dense head, which runs on the device only when the flag is set and then overwrites the tokens.
- `PredicatedHead` (the ablation): the same graph without the IF node; the dense GEMV is a Triton kernel that
  reads the flag and returns at once when it is clear — every replay launches it, so the launch cost stays.

The stages are the reference ones by default; the engine plugin passes the Triton kernels (`select.stages`, top-K
without its host-side repair) and its device counters, which the graph adds to on every replay (no host sync).
Padding rows (up to the bucket size) belong to a request of their own that is masked out of `need_dense`, so they
never trigger a fallback. Conditional bodies may hold only kernels, memsets, memcpys and child graphs (no events):
tensor parallelism's collectives cannot run inside; this path is for TP = 1. The fallback's dense head here is
`hidden @ W.T` (cuBLAS) in the weight's dtype; a certified row is exact whatever the dense head's order, so the
combination is a valid dense head — but bit-equality with another process's dense run holds only on certified
steps (a fallback step uses this process's cuBLAS).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from draftscope.head.certify import DEFAULT_K, NO_DRAFT, certify
from draftscope.head.policy import prefix_decision, rowwise_decision
from draftscope.head.quant import QuantizedHead
from draftscope.head.runtime import HeadCounters

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Replay(NamedTuple):
    tokens: torch.Tensor  # long [N]: certified tokens, or the dense head's when need_dense
    need_dense: torch.Tensor  # 0-dim bool
    certified: torch.Tensor  # bool [N]


def conditional_nodes_available() -> bool:
    """IF nodes need CUDA ≥ 12.4 (not ROCm) and a torch that exposes them."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    return version >= (12, 4) and hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node")


def bucket_for(rows: int) -> int:
    for size in BUCKETS:
        if rows <= size:
            return size
    raise ValueError(f"{rows} rows exceed the largest graph bucket ({BUCKETS[-1]}); use the eager head")


@dataclass
class _Graph:
    graph: Any
    hidden: torch.Tensor  # [B, D] static input
    draft: torch.Tensor  # [B] static input (-1: bonus or padding)
    request: torch.Tensor  # [B] static input (padding rows: request index R)
    real: torch.Tensor  # [R + 1] bool static input: which requests are real
    local_pos: torch.Tensor  # [B] static input: each row's position within its request
    tokens: torch.Tensor  # [B] static output
    certified: torch.Tensor  # [B] bool static output
    need_dense: torch.Tensor  # 0-dim bool static output


class _CapturedHead(abc.ABC):
    """Common machinery: static buffers per bucket, warm-up, capture, replay."""

    predicated = False

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        k: int = DEFAULT_K,
        group_size: int | None = None,
        max_requests: int = 16,
        quantized: QuantizedHead | None = None,
        stages: Any = None,
        counters: HeadCounters | None = None,
        triggers: torch.Tensor | None = None,
    ) -> None:
        """`quantized`: the coarse head (built from `weight` when None); `stages`: a `select.Stages` (the
        reference stages when None; the engine plugin passes the Triton kernels' capturable stages); `counters`
        and `triggers` (a histogram over the row of its request that triggered a fallback): device tensors the
        graph adds to on every replay (read by their owner every N steps)."""
        self.weight = weight
        self.k = k
        self.max_requests = max_requests
        self.quantized = quantized if quantized is not None else QuantizedHead.build(weight, group_size)
        self.stages = stages
        self.counters = counters
        self.triggers = triggers
        self.graphs: dict[int, _Graph] = {}
        self.pool: Any = None  # one memory pool for every bucket's graph
        self._warming = False  # warm-up replays must not count

    def _body(self, g: _Graph) -> None:
        extra = self.stages.certify_kwargs(self.quantized, g.hidden) if self.stages is not None else {}
        cert = certify(self.quantized, g.hidden, g.draft, k=self.k, out_dtype=self.weight.dtype, **extra)
        requests = self.max_requests + 1
        decision = prefix_decision(cert.certified, cert.tokens, g.draft, g.request, requests=requests)
        need = (decision.request_dense & g.real).any()
        g.need_dense.copy_(need)
        g.tokens.copy_(cert.tokens)
        g.certified.copy_(cert.certified)
        if self.counters is not None and not self._warming:
            real_row = g.real[g.request]
            certified = cert.certified & real_row
            rowwise = rowwise_decision(cert.certified, g.request, requests=requests)
            self.counters.add(
                calls=1,
                rows=real_row.sum(),
                certified=certified.sum(),
                uncertified_relevant=(decision.relevant & ~cert.certified & real_row).sum(),
                uncertified_irrelevant=(~decision.relevant & ~cert.certified & real_row).sum(),
                dense_calls=need.to(torch.int64),
                dense_calls_rowwise=(rowwise.request_dense & g.real).any().to(torch.int64),
                dense_calls_prefix=need.to(torch.int64),
                ties=(cert.ties * certified).sum(),
            )
        if self.triggers is not None and not self._warming:
            fired = (decision.trigger >= 0) & g.real
            where = g.local_pos[decision.trigger.clamp(min=0)].clamp(max=self.triggers.shape[0] - 1)
            self.triggers.index_put_((where,), fired.to(torch.int64), accumulate=True)
        self._dense(g)

    @abc.abstractmethod
    def _dense(self, g: _Graph) -> None:
        """Capture the dense fallback so that it takes effect only when `g.need_dense` is set."""

    def _buffers(self, size: int) -> _Graph:
        dev, d = self.weight.device, self.weight.shape[1]
        return _Graph(
            graph=None,  # set by capture()
            hidden=torch.zeros(size, d, dtype=self.weight.dtype, device=dev),
            draft=torch.full((size,), NO_DRAFT, dtype=torch.long, device=dev),
            request=torch.full((size,), self.max_requests, dtype=torch.long, device=dev),
            real=torch.zeros(self.max_requests + 1, dtype=torch.bool, device=dev),
            local_pos=torch.zeros(size, dtype=torch.long, device=dev),
            tokens=torch.zeros(size, dtype=torch.long, device=dev),
            certified=torch.zeros(size, dtype=torch.bool, device=dev),
            need_dense=torch.zeros((), dtype=torch.bool, device=dev),
        )

    def capture(self, size: int) -> _Graph:
        if self.weight.device.type != "cuda":
            raise ValueError("the device-side head needs the weight on a CUDA device")
        g = self._buffers(size)
        g.graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        self._warming = True
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside capture: cuBLAS handles, workspaces, Triton JIT
                self._body(g)
                g.need_dense.fill_(True)
                self._dense_eager(g)
        self._warming = False
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(g.graph, pool=self.pool):
            self._body(g)
        self.graphs[size] = g
        return g

    def capture_all(self, max_rows: int) -> list[int]:
        """Capture every bucket up to the one holding `max_rows` rows now (an engine's start-up, where its memory
        profile sees the graphs' pool), not on a step's first use; returns the bucket sizes."""
        sizes = [size for size in BUCKETS if size <= bucket_for(max_rows)]
        for size in sizes:
            if size not in self.graphs:
                self.capture(size)
        return sizes

    def _dense_eager(self, g: _Graph) -> None:
        g.tokens.copy_((g.hidden @ self.weight.T).argmax(dim=-1))

    def __call__(
        self,
        hidden: torch.Tensor,
        draft: torch.Tensor,
        request: torch.Tensor,
        requests: int,
        local_pos: torch.Tensor | None = None,
    ) -> Replay:
        """(tokens [N], need_dense, certified [N]) for N rows of `requests` requests; all stay on the device."""
        n = hidden.shape[0]
        if requests > self.max_requests:
            raise ValueError(f"{requests} requests exceed max_requests={self.max_requests}")
        size = bucket_for(n)
        g = self.graphs.get(size) or self.capture(size)
        g.hidden[:n].copy_(hidden)
        g.hidden[n:].zero_()
        g.draft[:n].copy_(draft)
        g.draft[n:].fill_(NO_DRAFT)
        g.request[:n].copy_(request)
        g.request[n:].fill_(self.max_requests)
        g.real.zero_()
        g.real[:requests] = True
        if local_pos is not None:
            g.local_pos[:n].copy_(local_pos)
        g.graph.replay()
        return Replay(g.tokens[:n], g.need_dense, g.certified[:n])


class ConditionalHead(_CapturedHead):
    """The dense head inside a CUDA conditional IF node: it runs only when `need_dense` is set."""

    def __init__(self, weight: torch.Tensor, **kwargs: Any) -> None:
        if not conditional_nodes_available():
            raise RuntimeError("CUDA conditional graph nodes need CUDA ≥ 12.4 and a torch that exposes them")
        super().__init__(weight, **kwargs)
        self._capturing = False

    def _dense(self, g: _Graph) -> None:
        if not g.hidden.is_cuda or not torch.cuda.is_current_stream_capturing():
            return  # warm-up: the eager dense pass is warmed separately
        graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
        graph.begin_capture_to_if_node(g.need_dense)
        self._dense_eager(g)
        graph.end_capture_to_conditional_node()


class PredicatedHead(_CapturedHead):
    """The ablation: a dense GEMV kernel launched on every replay that exits at once when the flag is clear."""

    predicated = True

    def _dense(self, g: _Graph) -> None:
        # lazy: triton and its kernels, only for the predicated dense ablation
        from draftscope.head.graph_kernels import predicated_dense_argmax

        predicated_dense_argmax(g.hidden, self.weight, g.need_dense, g.tokens)
