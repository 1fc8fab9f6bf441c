"""Launchers: where a planner's work runs. The planners (`bench`, `pipeline`) hand a launcher their work
(`base.Work`; as jobs, `base.Batch` with a chain of `plan.Job`s); the launcher runs it and hands back their
outcome. `registry` names them: `local` (here, in this process) and `slurm` (batch jobs: scripts, ledger,
submission, following, cancellation; `slurm/`). In a job, `injob` is what every in-job entry point needs, from the
launcher that submitted it. `outcomes` is how a chain of stages ends, however it ran. Nothing here imports a
planner; each step still runs through a runtime (`draftscope.runtime`), below.
"""
