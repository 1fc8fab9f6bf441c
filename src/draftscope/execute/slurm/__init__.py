"""The Slurm launcher: a planner's work as a chain of batch jobs (`execute.plan`), submitted, followed and cancelled.

`launcher` runs a submission (`sbatch --test-only`, the scripts, `sbatch`, following, Ctrl-C) and its dry run;
`script` renders the job scripts and `sbatch` lines (pure: the dry run prints exactly what a submission writes);
`ledger` keeps every submission in `jobs.json`; `states` maps Slurm's job states onto the run's statuses; `node` is
the in-job side (the job's id and nodes, the stop grace before KillWait, Slurm's account of a stop or of an array's
tasks); `env` reads every SLURM_* variable; `options` checks the `--executor`/`--partition`/`--account`/`--qos`
flags; every Slurm command goes through `client`.

Which jobs a plan becomes and what each runs on its node is the planner's: the pipeline's stages
(`draftscope.pipeline.batch`), a benchmark (`draftscope.bench.batch`). Nothing here imports them or torch; the dry
run runs no Slurm command and writes no file.
"""
