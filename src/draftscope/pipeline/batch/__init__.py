"""The pipeline as batch jobs: which jobs a pipeline plan becomes, and what each runs on its node.

`invoke pipeline --executor slurm` turns each stage's Step into a job (`jobs`: a chain of `execute.plan.Job`s) and
hands the work to the launcher (`submit`: the pipeline's part of a submission, `execute.base.Batch`), which submits
and follows the jobs; the stages' outcomes are read back from their records. Inside each job the kit runs the stage
through the runtime a local run uses (`commands`, `python -m draftscope.pipeline.batch`), so the in-container argv
and the stage records are a local run's; the job rebuilds the submitted plan from `slurm/plan.json` (`planfile`).
regen runs as a job array of shards merged by one more job, hsextract as a job array writing into one folder
followed by a job that checks the whole output (`shards`); training spans nodes with one torchrun per node. `layout`
says where a submission's files go. What the scheduler knows of a job comes from its launcher (`execute.injob`).

Nothing here imports torch; the dry run runs no scheduler command and writes no file.
"""
