"""The finalizer's frame assembly from tiles read ahead (converted) and tiles read at
finalization (accumulators): whichever mix, the frame's bytes are the whole frame's
conversion."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import kernel
from kernel.rect import Rect
from services.finalizer.assemble import _convert, _float_image, _frames
from services.finalizer.cache import Images
from shared.core.tiles import Accumulator

_SPP = 5
_ROWS = ((0, 32), (32, 64), (64, 70))
_COLS = ((0, 24), (24, 48), (48, 53))


def _tiles() -> list[Rect]:
    return [Rect(x0, y0, x1, y1) for y0, y1 in _ROWS for x0, x1 in _COLS]


@pytest.mark.parametrize("display_referred", [False, True])
@pytest.mark.parametrize(
    "converted",
    [
        pytest.param(set(), id="none-read-ahead"),  # all accumulators: one conversion
        pytest.param({0, 4}, id="few-read-ahead"),  # accumulators cover over half: one conversion
        pytest.param(set(range(9)) - {2, 7}, id="most-read-ahead"),  # converted apart
        pytest.param(set(range(9)), id="all-read-ahead"),
    ],
)
def test_any_mix_of_parts_gives_the_frames_bytes(
    display_referred: bool, converted: set[int]
) -> None:
    rng = np.random.default_rng(len(converted))
    acc = rng.exponential(0.6, size=(70, 53, 3)) * _SPP
    acc[1, 2] = [np.nan, np.inf, -1.0]
    if display_referred:
        flt, whole = kernel.float_image_and_display16(acc, _SPP)
    else:
        flt, whole = kernel.float_image_and_tonemap(acc, _SPP)
    parts: list[tuple[Rect, Accumulator | Images]] = []
    for i, rect in enumerate(_tiles()):
        tile = acc[rect.y0 : rect.y1, rect.x0 : rect.x1].copy()
        part = _convert(tile, _SPP, display_referred) if i in converted else tile
        parts.append((rect, part))
    parts.reverse()  # the order parts arrive in is not the frame's
    mean, image = _frames(53, 70, (_SPP, display_referred), parts)
    assert _float_image(mean) == (flt, hashlib.sha256(flt).hexdigest())
    assert image.dtype == whole.dtype
    np.testing.assert_array_equal(image, whole)
