"""Render settings: image size, samples, path depth and seed, with documented limits."""

from __future__ import annotations

from dataclasses import dataclass

from kernel.scene import SceneError

MAX_IMAGE_SIDE = 8192
"""Largest width or height; also what keeps the parallel row permutation a permutation."""
MAX_SPP = 1_000_000
MAX_DEPTH = 1024
MAX_SEED = 2**63 - 1
MAX_FRAME = 10_000_000
DEFAULT_MAX_DEPTH = 64


@dataclass(frozen=True)
class RenderSettings:
    """How to render one frame. Construct freely; :meth:`validate` checks the limits.

    ``spp`` counts pixel samples (smallpt's "4 subpixels x samps"); ``max_depth`` caps the
    number of surface interactions per path (Russian roulette usually ends paths far sooner);
    ``seed`` selects an independent, reproducible noise pattern.
    """

    width: int
    height: int
    spp: int
    max_depth: int = DEFAULT_MAX_DEPTH
    seed: int = 0

    def validate(self) -> RenderSettings:
        """Return self, or raise :class:`SceneError` naming the field and its limit."""
        _check_int(self.width, "settings.width", 1, MAX_IMAGE_SIDE)
        _check_int(self.height, "settings.height", 1, MAX_IMAGE_SIDE)
        _check_int(self.spp, "settings.spp", 1, MAX_SPP)
        _check_int(self.max_depth, "settings.max_depth", 1, MAX_DEPTH)
        _check_int(self.seed, "settings.seed", 0, MAX_SEED)
        return self


def check_frame(frame: object) -> int:
    """The frame number, or :class:`SceneError` if it is not an int in [0, MAX_FRAME]."""
    return _check_int(frame, "frame", 0, MAX_FRAME)


def _check_int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SceneError(f"{name} must be an integer")
    if not lo <= value <= hi:
        raise SceneError(f"{name} must be between {lo} and {hi} (got {value})")
    return value
