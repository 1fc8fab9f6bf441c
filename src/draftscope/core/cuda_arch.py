"""CUDA architecture lists as the kit spells them (`8.0;9.0`, TORCH_CUDA_ARCH_LIST style), checked once for every
layer: the vllm image's build argument (`ops.images.build`) and the head's ahead-of-time Triton compile
(`head.triton_aot`), which needs them as Triton's integer capabilities (80, 90)."""

from __future__ import annotations

import re

from draftscope.core.errors import UserError

# One CUDA architecture as TORCH_CUDA_ARCH_LIST spells it: 8.0, 9.0a, 10.0+PTX. `\Z`, not `$` (a trailing newline).
ARCH = re.compile(r"^\d{1,2}\.\d[a-f]?(\+PTX)?\Z")


def validate_cuda_arch(text: str, source: str = "--cuda-arch") -> str:
    """Normalise `9.0`, `8.0;9.0` or `8.0 9.0` to `8.0;9.0`; reject empty lists and `all`."""
    parts = [p for p in re.split(r"[;,\s]+", text.strip()) if p]
    if not parts:
        raise UserError("the CUDA architecture list is empty", field=source, fix="pass e.g. 9.0 or '8.0;9.0'")
    bad = [p for p in parts if not ARCH.match(p)]
    if bad:
        raise UserError(
            "not a CUDA architecture (compute capability, like 8.0, 9.0a or 10.0+PTX)",
            field=source,
            value=bad[0],
            fix="list the target GPUs' compute capabilities, e.g. '8.0;9.0' (never 'all')",
        )
    return ";".join(dict.fromkeys(parts))


def capabilities(text: str, source: str = "--cuda-arch") -> list[int]:
    """The distinct compute capabilities of a list as Triton's `GPUTarget` takes them: `8.0;9.0a` → [80, 90].

    The suffixes mean nothing to Triton: it compiles a cubin (no PTX to embed, so `+PTX` drops) and itself picks the
    arch-specific `sm_90a` for 9.0 (its target is the device's capability, which has no `a`)."""
    caps = []
    for part in validate_cuda_arch(text, source).split(";"):
        major, minor = part.removesuffix("+PTX").rstrip("abcdef").split(".")
        caps.append(int(major) * 10 + int(minor))
    return sorted(set(caps))
