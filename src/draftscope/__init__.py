"""draftscope: a containerized reproducibility kit for speculative decoding on NVIDIA GPUs.

Importing the package is cheap and never imports torch, vLLM, SGLang or speculators: the host side
(planning, dry runs, validation, analysis) must work on a machine that has none of them.
"""

__version__ = "0.1.0"

from draftscope.core.errors import UserError

__all__ = ["UserError", "__version__"]
