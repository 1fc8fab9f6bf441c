"""The kit's images by name, and the stage/backend → image map (DESIGN.md)."""

from __future__ import annotations

from draftscope import __version__
from draftscope.errors import UserError

IMAGES = ("transformers", "vllm", "train", "sglang")

# Which image runs which step.
STEP_IMAGES = {
    "benchmark:transformers": "transformers",
    "benchmark:vllm": "vllm",
    "fetch": "transformers",
    "regen": "vllm",
    "pretokenize": "train",
    "prepare": "train",
    "hsextract": "train",
    "train": "train",
    "convert": "train",
    "serve": "sglang",
    "bench": "sglang",
}


def image_reference(name: str) -> str:
    """The local reference an image is built and run under (`localhost/` avoids registry look-ups)."""
    if name not in IMAGES:
        raise UserError(f"no image named '{name}'", field="image", fix=f"choose one of: {', '.join(IMAGES)}")
    return f"localhost/draftscope-{name}:{__version__}"
