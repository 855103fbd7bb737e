"""The worker: leases tiles, renders them in sample passes, checkpoints, commits fenced."""
