"""The Slurm executor: the pipeline's stages as Slurm jobs, through the same plan and the same runtimes.

`invoke pipeline --executor slurm` turns each stage's Step into a job script (`jobs`), submits the chain with
`sbatch` and follows it (`executor`); inside each job the kit runs the stage through the runtime a local run uses
(`node`, `python -m draftscope.execute.slurm`), so the in-container argv and the stage records are a local run's. regen
runs as a job array of shards merged by one more job, hsextract as a job array writing into one folder followed by
a job that checks the whole output (`shards`); training spans nodes with srun + torchrun.
Slurm's job states map onto the run's statuses (`states`); every Slurm command goes through `client`.

Nothing here imports torch; the dry run runs no Slurm command and writes no file.
"""
