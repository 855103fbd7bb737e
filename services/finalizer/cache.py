"""Read-ahead of tile results, so finalization does not start by reading every tile.

Each tile-done event names its result object; the finalizer that receives it reads the object
right away, while the other tiles still render, and keeps the parsed accumulator here with the
sha256 of the bytes it was parsed from (parsing a ``.npy`` header is most of the cost of using
one, so that is done early too), and the tile's float32 mean and display image converted for
its job's samples and renderer (:func:`kernel.image.display_images`: per element, so
finalization only places them, and the conversion is off the job's tail). The finalizer that
finalizes the job uses an entry only if the tile row (the source of truth) names the same
object and the same sha256 and the accumulator has the tile's shape, and its images only if
they were converted for the job's samples and renderer; anything missing or different is read
from the store (or converted) as before. Several finalizers each hold what their own events
named; none depends on it.

Bounded in bytes: past the budget, whole jobs are dropped, least recently touched first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from shared.core.tiles import Accumulator

__all__ = ["Images", "ReadAhead", "Result"]


class Images(NamedTuple):
    """A tile's images as :func:`kernel.image.display_images` converts them, and for what."""

    samples: int
    display_referred: bool
    mean: np.ndarray
    image: np.ndarray


class Result(NamedTuple):
    """One tile result as read: its object key, the sha256 of its bytes, what they hold, and
    (when its job was known) its images."""

    key: str
    sha256: str
    acc: Accumulator
    images: Images | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held."""
        extra = 0 if self.images is None else self.images.mean.nbytes + self.images.image.nbytes
        return self.acc.nbytes + extra


class ReadAhead:
    """Tile results by job, at most ``budget`` bytes in all."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bytes = 0
        self._jobs: OrderedDict[str, dict[int, Result]] = OrderedDict()

    def has(self, job_id: str, tile_index: int) -> bool:
        """True if the tile's result is held."""
        return self.get(job_id, tile_index) is not None

    def get(self, job_id: str, tile_index: int) -> Result | None:
        """The tile's held result, if any (it stays held)."""
        return self._jobs.get(job_id, {}).get(tile_index)

    def put(self, job_id: str, tile_index: int, result: Result) -> None:
        """Hold ``result`` (a result larger than the whole budget is not held)."""
        if result.nbytes > self.budget:
            return
        tiles = self._jobs.setdefault(job_id, {})
        self._jobs.move_to_end(job_id)
        old = tiles.get(tile_index)
        if old is not None:
            self.bytes -= old.nbytes
        tiles[tile_index] = result
        self.bytes += result.nbytes
        while self.bytes > self.budget:
            _, dropped = self._jobs.popitem(last=False)
            self.bytes -= sum(r.nbytes for r in dropped.values())

    def take(self, job_id: str) -> dict[int, Result]:
        """The job's results, no longer held."""
        tiles = self._jobs.pop(job_id, {})
        self.bytes -= sum(r.nbytes for r in tiles.values())
        return tiles
