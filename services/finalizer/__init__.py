"""The finalizer: assembles a job whose tiles are all done and publishes exactly one image."""
