"""The local launcher (`--executor local`, the default): the planner's own runner, here, in this process — the
pipeline's stages one after another, a benchmark's supervisor — each step through the run's runtime (a container,
or this Python environment). The inline launcher of the family: no job, no scheduler, nothing between the command
and the work."""

from __future__ import annotations

from typing import Any

from draftscope.execute.base import Printer, Work


class LocalLauncher:
    name = "local"
    node = None  # no job: nothing runs elsewhere

    def ready(self) -> None:
        return None

    def dry_run_lines(self, work: Work[Any]) -> list[str]:
        return work.dry_run_here()

    def launch(self, work: Work[Any], *, argv: list[str], say: Printer) -> Any:
        return work.run_here(argv=argv, say=say)
