"""Accumulator → images. Tone mapping is smallpt's: clamp the mean radiance to [0, 1], apply
gamma 1/2.2, scale to 0..255 and round half up (``int(x ** (1 / 2.2) * 255 + 0.5)``).

PNG bytes are deterministic: 8-bit RGB, fixed zlib level, no timestamps, text or colour-profile
chunks. The float image is the mean radiance as a float32 ``.npy`` (no pickle), for compositing.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

GAMMA = 2.2
PNG_COMPRESS_LEVEL = 6


def _mean(accumulator: np.ndarray, samples: int) -> np.ndarray:
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    acc = np.asarray(accumulator)
    if acc.ndim != 3 or acc.shape[2] != 3 or acc.shape[0] < 1 or acc.shape[1] < 1:
        raise ValueError(f"accumulator must have shape (height, width, 3), got {acc.shape}")
    mean: np.ndarray = acc.astype(np.float64) / float(samples)
    return mean


def tonemap(accumulator: np.ndarray, samples: int) -> np.ndarray:
    """8-bit sRGB-ish image (height, width, 3) of the mean of ``samples`` summed samples."""
    mean = np.nan_to_num(_mean(accumulator, samples), nan=0.0, posinf=1.0, neginf=0.0)
    mapped = np.power(np.clip(mean, 0.0, 1.0), 1.0 / GAMMA) * 255.0 + 0.5
    image: np.ndarray = mapped.astype(np.uint8)
    return image


def encode_png(accumulator: np.ndarray, samples: int) -> bytes:
    """PNG bytes of :func:`tonemap`; identical inputs give identical bytes."""
    buf = io.BytesIO()
    Image.fromarray(tonemap(accumulator, samples)).save(
        buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL
    )
    return buf.getvalue()


def encode_float_image(accumulator: np.ndarray, samples: int) -> bytes:
    """``.npy`` bytes of the float32 mean radiance, shape (height, width, 3)."""
    buf = io.BytesIO()
    np.save(buf, _mean(accumulator, samples).astype(np.float32), allow_pickle=False)
    return buf.getvalue()
