"""Engine management and (coming) the TRL trainer, run in the engine+trainer environment."""
