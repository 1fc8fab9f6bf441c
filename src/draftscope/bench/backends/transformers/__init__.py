"""The Transformers backend: the kit's own greedy and speculative loop (`draftscope.decode`), in the transformers
image or locally, on an NVIDIA GPU or the CPU. Its engine (`backend.py`) imports torch only when a run starts."""

from __future__ import annotations

from draftscope.bench.backends.spec import Backend
from draftscope.bench.backends.transformers import config

BACKEND = Backend(
    name="transformers",
    image="transformers",
    engine="draftscope.bench.backends.transformers.backend:TransformersBackend",
    devices=config.DEVICES,
    default_experiment="transformers-baseline",
    check=config.check,
)
