"""Which implementation of the certified head an engine process runs, chosen once per device, with the reason.

- `cuda-graph` (the design): the Triton coarse / top-K / refine kernels (`triton_kernels`, the code `head-bench
  --device cuda` times) inside one captured CUDA graph per padded row-count bucket, the dense fallback in a
  conditional IF node, the counters updated on the device by the graph (`graph.ConditionalHead`). No host sync
  per step: the head returns argmax-equivalent logits of the graph's tokens.
- `cuda-triton`: the same kernels, eager, one host sync per step to choose the logits; chosen on CUDA when the
  graph cannot be (no conditional nodes: CUDA < 12.4, ROCm; or more rows than the largest bucket).
- `cuda-reference`: the PyTorch reference stages (`serving.coarse_in_chunks`, `torch.topk`, `certify.refine`);
  chosen on CUDA only when Triton is missing.
- `cpu`: the CPU coarse pass (`coarse_impl`: INT8 activations × INT8 weights, `cpu_coarse`) with the reference
  top-K and refine, one decision per step on the host.

Every choice other than `cuda-graph` carries `reason`: why the graph path was not chosen. The plugin writes the
choice into its status (which the run's manifest carries).

`coarse_impl(device)` is the seam for the CPU coarse pass: the one place that says which function computes the
coarse logits and bounds on a CPU.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from draftscope.head import serving
from draftscope.head.certify import Refine, TopK
from draftscope.head.cpu_coarse import MAX_GROUP, Int8Coarse
from draftscope.head.graph import BUCKETS, conditional_nodes_available
from draftscope.head.quant import Coarse, QuantizedHead

CoarseFn = Callable[[QuantizedHead, torch.Tensor], Coarse]
IMPLEMENTATIONS = ("cuda-graph", "cuda-triton", "cuda-reference", "cpu")
NO_GPU = "no CUDA device: conditional graph nodes and the Triton kernels need an NVIDIA GPU"


@dataclass(frozen=True)
class Implementation:
    name: str  # one of IMPLEMENTATIONS
    coarse: str  # what computes the coarse pass: "triton" or the CPU / reference function's name
    graph: bool  # the captured conditional graph (no host sync per step)
    reason: str | None  # why the graph path was not chosen; None when it was

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "coarse": self.coarse, "graph": self.graph, "reason": self.reason}


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def select(
    device: serving.DeviceFacts,
    *,
    max_rows: int,
    triton: bool | None = None,
    conditional: bool | None = None,
) -> Implementation:
    """The implementation for a device described by `device` (`serving.probe_device`); `triton` and
    `conditional` default to what this process offers (the tests pass them to describe another machine)."""
    if not device.cuda:
        return Implementation("cpu", coarse_name(torch.device("cpu")), graph=False, reason=NO_GPU)
    if not (triton_available() if triton is None else triton):
        return Implementation(
            "cuda-reference",
            coarse_name(torch.device("cuda")),
            graph=False,
            reason="Triton is not installed in the engine's Python (the kernels and the graph path need it)",
        )
    if not (conditional_nodes_available() if conditional is None else conditional):
        reason = (
            f"CUDA conditional graph nodes are unavailable (CUDA toolkit {device.toolkit}; they need CUDA >= "
            "12.4 and a torch that exposes CUDAGraph.begin_capture_to_if_node)"
        )
        return Implementation("cuda-triton", "triton", graph=False, reason=reason)
    if max_rows > BUCKETS[-1]:
        reason = f"max_rows {max_rows} exceeds the largest graph bucket ({BUCKETS[-1]} rows)"
        return Implementation("cuda-triton", "triton", graph=False, reason=reason)
    return Implementation("cuda-graph", "triton", graph=True, reason=None)


# --- the stages each implementation runs -------------------------------------------------------------------------


def coarse_impl(device: torch.device) -> CoarseFn:
    """The coarse pass (logits, upper bounds U, A bounds) for `device` outside the Triton paths: on a CPU the
    INT8 × INT8 pass (`cpu_int8_coarse`), elsewhere the reference in vocabulary chunks."""
    return cpu_int8_coarse if device.type == "cpu" else serving.coarse_in_chunks


# One Int8Coarse per head (its tables cost a pass over the weights); the head is kept with it, so an id is never
# reused for another head while its entry lives.
_INT8: dict[int, tuple[QuantizedHead, Int8Coarse | None]] = {}


def cpu_int8_coarse(head: QuantizedHead, hidden: torch.Tensor) -> Coarse:
    """`cpu_coarse.Int8Coarse` (hidden rows quantized to INT8 too, torch's exact int8 GEMM, the activation error in
    U), built once per head, where its probe finds the kernel exact on this CPU; the reference in vocabulary chunks
    where it does not (a CPU without VNNI, a group wider than the int32 bound)."""
    entry = _INT8.get(id(head))
    if entry is None or entry[0] is not head:
        usable = (
            head.weight.device.type == "cpu" and head.group_size <= MAX_GROUP and Int8Coarse.available(head)
        )
        entry = (head, Int8Coarse.build(head) if usable else None)
        _INT8[id(head)] = entry
    built = entry[1]
    return built.coarse(hidden) if built is not None else serving.coarse_in_chunks(head, hidden)


def coarse_name(device: torch.device) -> str:
    fn = coarse_impl(device)
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


@dataclass(frozen=True)
class Stages:
    """What `certify` runs: the coarse pass, and top-K / refine (None: the reference in `certify`)."""

    coarse: CoarseFn
    topk: TopK | None = None
    refine: Refine | None = None

    def certify_kwargs(self, head: QuantizedHead, hidden: torch.Tensor) -> dict[str, Any]:
        return {"bounds": self.coarse(head, hidden), "topk": self.topk, "refine_fn": self.refine}


def stages(impl: Implementation, device: torch.device, *, capturable: bool = False) -> Stages:
    """The stages of `impl`. `capturable`: inside a CUDA graph (top-K without its host-side repair; see
    `triton_kernels.topk_triton`)."""
    if impl.coarse != "triton":
        return Stages(coarse_impl(device))
    # lazy: the Triton kernels, only where Triton runs them
    from draftscope.head.triton_kernels import coarse_triton, refine_triton, topk_triton

    topk = functools.partial(topk_triton, repair=False) if capturable else topk_triton
    return Stages(coarse_triton, topk, refine_triton)
