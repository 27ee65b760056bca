"""Fine-tuning: the Lightning data module and task modules, the run, experiment tracking."""
