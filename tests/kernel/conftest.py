from __future__ import annotations

import functools

import numpy as np

import kernel

WIDTH, HEIGHT, SPP = 24, 16, 8


@functools.cache
def prepared(
    name: str, frame: int = 0, width: int = WIDTH, height: int = HEIGHT
) -> kernel.Prepared:
    """Prepared built-in scene at a test-sized resolution (cached: preparation is pure)."""
    return kernel.prepare(
        kernel.builtin_scene(name), frame, kernel.RenderSettings(width, height, SPP)
    )


def full(p: kernel.Prepared, s0: int, s1: int, parallel: bool = False) -> np.ndarray:
    acc = np.zeros((p.settings.height, p.settings.width, 3))
    kernel.render_full(p, s0, s1, acc, parallel=parallel)
    return acc


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of float buffers (NaN-safe and -0.0-sensitive, unlike ==)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
