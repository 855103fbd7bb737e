"""The pure core: errors, the job and tile lifecycles, retry policy, tile plans,
settings, crash and pause points. Imports no other Tessera package and no I/O library.
"""
