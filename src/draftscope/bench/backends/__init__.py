"""Benchmark backends: an explicit registry. Each backend runs inside its image (or locally) and imports its
engine lazily, so that listing or planning never imports torch or vLLM."""

from __future__ import annotations

from collections.abc import Callable

from draftscope.core.errors import UserError


def _transformers():
    from draftscope.bench.backends.transformers import TransformersBackend

    return TransformersBackend


def _vllm():
    from draftscope.bench.backends.vllm import VllmBackend

    return VllmBackend


BACKENDS: dict[str, Callable[[], type]] = {"transformers": _transformers, "vllm": _vllm}


def backend_class(name: str) -> type:
    if name not in BACKENDS:
        raise UserError(
            f"unknown backend '{name}'", field="--backend", fix=f"choose one of: {', '.join(BACKENDS)}"
        )
    return BACKENDS[name]()
