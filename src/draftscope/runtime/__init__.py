"""Runtimes execute a planned Step: in a container (`docker`, `podman`: the same argv, the engine is a parameter)
or `local` (the same in-container argv run in this Python environment: CPU smoke runs, CI, the demo).

A runtime owns the time limit, the container's name, killing on expiry, log capture and the exit code.
"""

from __future__ import annotations

from draftscope.core.errors import UserError
from draftscope.runtime.base import Context, Outcome, Runtime
from draftscope.runtime.container import ContainerRuntime
from draftscope.runtime.local import LocalRuntime

RUNTIMES = ("docker", "podman", "local")


def get_runtime(name: str) -> Runtime:
    if name == "local":
        return LocalRuntime()
    if name in ("docker", "podman"):
        return ContainerRuntime(name)
    raise UserError(
        f"unknown runtime '{name}'", field="--runtime", fix=f"choose one of: {', '.join(RUNTIMES)}"
    )


__all__ = ["RUNTIMES", "ContainerRuntime", "Context", "LocalRuntime", "Outcome", "Runtime", "get_runtime"]
