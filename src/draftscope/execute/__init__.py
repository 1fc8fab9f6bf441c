"""Executors: a plan of steps run locally or on Slurm (execute/slurm)."""
