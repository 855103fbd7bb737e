"""The scheduler: plans jobs into tiles, dead-letters exhausted messages, sweeps lost tiles."""
