"""The stages, in pipeline order: one explicit registry, no discovery. An unknown name lists the valid ones.

A stage is a subpackage `stages/<name>/` whose `__init__.py` declares `STAGE`; adding one is that subpackage plus
one line here. The plan, the runner and `python -m draftscope.pipeline` read the declarations from `STAGES`.
"""

from __future__ import annotations

from draftscope.core.errors import UserError
from draftscope.pipeline.base import Stage
from draftscope.pipeline.stages import bench, convert, hsextract, prepare, pretokenize, regen, serve, train

STAGES: tuple[Stage, ...] = (
    regen.STAGE,
    pretokenize.STAGE,
    prepare.STAGE,
    hsextract.STAGE,
    train.STAGE,
    convert.STAGE,
    serve.STAGE,
    bench.STAGE,
)
NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)


def _valid() -> str:
    # Read at call time, as get and select read STAGES: a test that registers a stage sees it listed.
    return ", ".join(s.name for s in STAGES)


def get(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise UserError(f"unknown stage '{name}'", field="--stage", fix=f"choose all or any of: {_valid()}")


def select(spec: str | None) -> tuple[Stage, ...]:
    """`all`, or a comma-separated list of stage names; returned in pipeline order, each once."""
    spec = (spec or "all").strip()
    if spec == "all":
        return STAGES
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UserError("no stage named", field="--stage", value=spec, fix=f"use all or any of: {_valid()}")
    wanted = {get(n).name for n in names}
    return tuple(s for s in STAGES if s.name in wanted)
