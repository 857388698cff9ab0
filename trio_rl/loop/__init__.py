"""The training loop: the pipeline's stages, the schedules, admission, the ledger, checkpoints and the run folder."""
