"""Renderers a worker can run: the numba kernel, Blender Cycles and POV-Ray."""
