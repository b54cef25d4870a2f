"""What keeps a run's folder trustworthy: checkpoint checksums, the run-folder lock, the resume
config check and the stop on signals (:mod:`grpo_lightning.checkpointing` uses them)."""
