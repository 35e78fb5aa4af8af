"""The SLURM tests' fixtures (defined in slurm_harness.py): slurm_cluster, slurm_jobs."""
from slurm_harness import slurm_cluster, slurm_jobs  # noqa: F401
