"""`slurm/plan.json`: what a job needs to rebuild, on its node, the plan the submitting host made.

The file holds the frozen config, the selected stages, the workdir, the runtime, how each stage runs as jobs, and
each stage's in-container argv. A job rebuilds the plan with the kit it runs (on shared storage: the same one) and
refuses to run when that plan's argv differs from the submitted one, e.g. a kit upgraded between submission and
start: the record would otherwise claim a command that never ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftscope.core.config import build
from draftscope.core.errors import UserError
from draftscope.core.jsonio import atomic_write_json, read_submitted
from draftscope.core.presets import load_model_preset
from draftscope.core.provenance import now
from draftscope.pipeline import plan as planning
from draftscope.pipeline import registry
from draftscope.pipeline.batch.jobs import JobPlan
from draftscope.pipeline.config import PipelineConfig, Resolved, check
from draftscope.pipeline.plan import PipelinePlan, StagePlan
from draftscope.runtime import Runtime, get_runtime

SCHEMA_VERSION = 1


def document(jp: JobPlan, *, force: bool) -> dict[str, Any]:
    plan = jp.plan
    stages: dict[str, Any] = {}
    for job in jp.jobs:
        if job.kind in ("merge", "check", "fetch"):
            continue
        sp = next(s for s in plan.stages if s.stage.name == job.stage)
        stages[job.stage] = {
            "kind": job.kind,
            "shards": job.array_size,
            "nodes": job.resources.nodes,
            "argv": list(sp.step.argv),
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "workdir": str(plan.workdir),
        "runtime": jp.runtime,
        "source": plan.source,
        "selected": [sp.stage.name for sp in plan.stages],
        "force": force,
        "fetch": any(j.kind == "fetch" for j in jp.jobs),
        "config": plan.config.to_dict(),
        "stages": stages,
        "written_at": now(),
    }


def write(jp: JobPlan, *, force: bool) -> Path:
    jp.folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(jp.plan_file, document(jp, force=force))
    return jp.plan_file


def read(path: Path) -> dict[str, Any]:
    return read_submitted(path, what="plan", folder="workdir", schema_version=SCHEMA_VERSION)


@dataclass(frozen=True)
class Loaded:
    doc: dict[str, Any]
    plan: PipelinePlan
    runtime: Runtime

    def stage(self, name: str) -> StagePlan:
        return next(sp for sp in self.plan.stages if sp.stage.name == name)

    def job(self, name: str) -> dict[str, Any]:
        if name not in self.doc["stages"]:
            raise UserError(f"stage {name} was not submitted", field="--stage", value=name)
        return self.doc["stages"][name]


def load(path: Path) -> Loaded:
    """The submitted plan, rebuilt here and checked against what was submitted."""
    doc = read(path)
    config: PipelineConfig = build(PipelineConfig, doc["config"])
    preset = load_model_preset(config.model_preset)
    check(config, preset, doc["source"])
    stages = tuple(registry.get(name) for name in doc["selected"])
    plan = planning.build(
        Resolved(config, preset, doc["source"]), stages, Path(doc["workdir"]), doc["runtime"]
    )
    for sp in plan.stages:
        submitted = doc["stages"].get(sp.stage.name, {}).get("argv")
        if submitted is not None and list(sp.step.argv) != submitted:
            raise UserError(
                f"the kit on this node plans another command for stage {sp.stage.name} than the submitting host did",
                source=str(path),
                fix="run the same draftscope (shared storage, same version) on the login and compute nodes",
            )
    return Loaded(doc, plan, get_runtime(doc["runtime"]))
