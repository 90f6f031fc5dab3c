//! Slurm observer (slurmrestd, scontrol) and actuator.
