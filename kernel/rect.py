"""The one pixel rectangle of Tessera: a tile, a band of a tile, or the whole frame.

It lives in the kernel, which imports nothing of Tessera (only numpy, numba and isal, and this
module imports nothing at all), so the kernel, the tile helpers (:mod:`shared.core.tiles`), the
metadata rows (:class:`shared.metadata.Tile`) and the services all use this one type, and a
client-only install (no numpy) can import it too.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Rect"]


class Rect(NamedTuple):
    """A pixel rectangle, half-open: ``[x0, x1) × [y0, y1)``, row 0 at the top of the image."""

    x0: int
    y0: int
    x1: int
    y1: int
