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
    mean: np.ndarray = acc.astype(np.float64, copy=False) / float(samples)  # a new array
    return mean


def _tonemap_in_place(mean: np.ndarray) -> np.ndarray:
    """:func:`tonemap` of a mean radiance array, overwriting it (one 8-bit array allocated)."""
    np.nan_to_num(mean, copy=False, nan=0.0, posinf=1.0, neginf=0.0)
    np.clip(mean, 0.0, 1.0, out=mean)
    np.power(mean, 1.0 / GAMMA, out=mean)
    np.multiply(mean, 255.0, out=mean)
    np.add(mean, 0.5, out=mean)
    image: np.ndarray = mean.astype(np.uint8)
    return image


def tonemap(accumulator: np.ndarray, samples: int) -> np.ndarray:
    """8-bit sRGB-ish image (height, width, 3) of the mean of ``samples`` summed samples."""
    return _tonemap_in_place(_mean(accumulator, samples))


def png_of(image: np.ndarray) -> bytes:
    """PNG bytes of an 8-bit (height, width, 3) image, as :func:`encode_png` writes them."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def encode_png(accumulator: np.ndarray, samples: int) -> bytes:
    """PNG bytes of :func:`tonemap`; identical inputs give identical bytes."""
    return png_of(tonemap(accumulator, samples))


def _npy(mean: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, mean.astype(np.float32), allow_pickle=False)
    return buf.getvalue()


def encode_float_image(accumulator: np.ndarray, samples: int) -> bytes:
    """``.npy`` bytes of the float32 mean radiance, shape (height, width, 3)."""
    return _npy(_mean(accumulator, samples))


def float_image_and_tonemap(accumulator: np.ndarray, samples: int) -> tuple[bytes, np.ndarray]:
    """:func:`encode_float_image` and :func:`tonemap` from one pass over the accumulator.

    The PNG is then :func:`png_of` the image (the slow part, which can run beside writing the
    float image); the bytes equal :func:`encode_png`'s.
    """
    mean = _mean(accumulator, samples)
    return _npy(mean), _tonemap_in_place(mean)
