"""Counter-based random numbers: every value is a pure hash of (seed, pixel, sample, dimension).

No generator state exists anywhere, so any sample of any pixel can be (re)computed on its own,
which is what makes resumed and re-tiled renders bit-identical. The mixer is the splitmix64
finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014); it
is a bijection on 64-bit integers, so distinct counters never collide before the final
truncation to a 53-bit double.
"""

from __future__ import annotations

import numpy as np

from kernel._jit import jit_inline

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV_2_53 = 1.0 / 9007199254740992.0


@jit_inline
def mix64(z: np.uint64) -> np.uint64:
    """The splitmix64 finaliser: a fast, well-avalanched bijection on uint64."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@jit_inline
def pixel_key(seed: int, frame: int, pixel: int) -> np.uint64:
    """Key shared by every sample of one pixel (pixel = y * width + x in the full image)."""
    k = mix64(np.uint64(seed) * _GOLDEN + np.uint64(1))
    return mix64(mix64(k + np.uint64(frame)) + np.uint64(pixel))


@jit_inline
def sample_key(pkey: np.uint64, sample: int) -> np.uint64:
    """Key of one sample of a pixel."""
    return mix64(pkey + np.uint64(sample) * _GOLDEN)


@jit_inline
def uniform(key: np.uint64, dim: int) -> float:
    """Uniform double in [0, 1) for dimension ``dim`` of the sample identified by ``key``."""
    z = mix64(key + np.uint64(dim + 1) * _GOLDEN)
    return np.float64(np.int64(z >> _S11)) * _INV_2_53
