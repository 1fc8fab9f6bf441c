"""Executors: a chain of jobs (`plan`: jobs, resources, dependencies, what each runs on its node) run on Slurm
(`slurm/`). The planners above build the chain (`pipeline/slurm/`, `bench/slurm.py`); nothing here imports them."""
