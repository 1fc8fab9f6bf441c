"""Benchmark backends: an explicit registry of `Backend` specs, one subpackage per backend (`<name>/__init__.py`
declares its spec, `config.py` its config rules, `backend.py` its engine).

Listing, planning and dry runs read only the specs, which import neither torch nor vLLM; the worker imports a
backend's engine (`Backend.engine_class`) when a run starts.
"""

from __future__ import annotations

from draftscope.bench.backends import transformers, vllm
from draftscope.bench.backends.spec import Backend
from draftscope.core.errors import UserError

BACKENDS: dict[str, Backend] = {
    "transformers": transformers.BACKEND,
    "vllm": vllm.BACKEND,
}


def get(name: str) -> Backend:
    """The spec of backend `name`; an unknown name is a UserError listing the valid ones."""
    if name not in BACKENDS:
        raise UserError(
            f"unknown backend '{name}'", field="--backend", fix=f"choose one of: {', '.join(BACKENDS)}"
        )
    return BACKENDS[name]


__all__ = ["BACKENDS", "Backend", "get"]
