"""The pipeline on Slurm: which jobs a pipeline plan becomes, and what each runs on its node.

`invoke pipeline --executor slurm` turns each stage's Step into a job (`jobs`: a chain of `execute.plan.Job`s),
hands the chain to the Slurm executor (`execute.slurm`), which submits and follows it, and reads the stages'
records back (`submit`). Inside each job the kit runs the stage through the runtime a local run uses (`node`,
`python -m draftscope.pipeline.slurm`), so the in-container argv and the stage records are a local run's; the job
rebuilds the submitted plan from `slurm/plan.json` (`planfile`). regen runs as a job array of shards merged by one
more job, hsextract as a job array writing into one folder followed by a job that checks the whole output
(`shards`); training spans nodes with srun + torchrun. `layout` says where a submission's files go.

Nothing here imports torch; the dry run runs no Slurm command and writes no file.
"""
