"""The Slurm executor: a chain of jobs (`execute.plan`) as job scripts, submitted, followed and cancelled.

`script` renders the job scripts and `sbatch` lines (pure: the dry run prints exactly what a submission writes),
`executor` checks (`sbatch --test-only`), writes, submits and follows the chain and cancels it on Ctrl-C, `ledger`
keeps every submission in `jobs.json`, `states` maps Slurm's job states onto the run's statuses, `node` is what
every in-job entry point needs (SIGTERM, the stop grace before KillWait, Slurm's account of a stop), `options` the
`--executor`/`--partition`/`--account`/`--qos` flags; every Slurm command goes through `client`.

Which jobs a plan becomes and what each runs on its node is the planner's: the pipeline's stages
(`draftscope.pipeline.slurm`), a benchmark (`draftscope.bench.slurm`). Nothing here imports torch; the dry run runs
no Slurm command and writes no file.
"""
