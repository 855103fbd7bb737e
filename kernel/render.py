"""Rendering entry points: add a range of samples of a rect (or the whole frame) to an accumulator.

Accumulators hold summed radiance (not averages) as float64 of shape (rows, columns, 3), row 0 at
the top of the image. Sample ``s`` of pixel (x, y) is the same number whichever call, tile or
variant computes it, and each call adds its samples to each pixel in increasing order, so
``[0, k)`` then ``[k, n)`` equals ``[0, n)`` bit for bit, and so does any tiling of the frame.
"""

from __future__ import annotations

import numpy as np

from kernel import trace
from kernel.flatten import Prepared
from kernel.rect import Rect


def render_tile(
    prepared: Prepared, rect: Rect, sample_start: int, sample_end: int, accumulator: np.ndarray
) -> None:
    """Add samples [sample_start, sample_end) of every pixel in ``rect`` to ``accumulator``.

    ``rect = (x0, y0, x1, y1)`` is half-open in image pixels; ``accumulator`` must be float64
    of shape (y1 - y0, x1 - x0, 3) and is updated in place. Runs on the calling thread and
    releases the GIL. Raises ``ValueError`` for a bad rect, sample range or accumulator.
    """
    rect_arr = _check(prepared, rect, sample_start, sample_end, accumulator)
    if sample_start == sample_end:
        return
    _run(prepared, rect_arr, sample_start, sample_end, accumulator, parallel=False)


def render_full(
    prepared: Prepared,
    sample_start: int,
    sample_end: int,
    accumulator: np.ndarray,
    parallel: bool = True,
) -> None:
    """:func:`render_tile` over the whole frame (accumulator shape (height, width, 3)).

    With ``parallel=True`` rows are spread over numba's thread pool; the result is identical.
    """
    rect = Rect(0, 0, prepared.settings.width, prepared.settings.height)
    rect_arr = _check(prepared, rect, sample_start, sample_end, accumulator)
    if sample_start == sample_end:
        return
    _run(prepared, rect_arr, sample_start, sample_end, accumulator, parallel=parallel)


def _run(
    prepared: Prepared, rect: np.ndarray, s0: int, s1: int, acc: np.ndarray, parallel: bool
) -> None:
    # A non-contiguous view (a tile of a larger buffer) is rendered through a contiguous copy:
    # the additions are the same, so the bits are too, and numba compiles one array layout.
    work = acc if acc.flags.c_contiguous else np.ascontiguousarray(acc)
    p = prepared
    geo = (p.spheres, p.triangles, p.normals, p.boxes, p.nodes, p.materials)
    if parallel:
        trace.render_rect_parallel(*geo, p.camera, p.params, rect, s0, s1, work)
    else:
        stack = np.empty(trace.STACK_SIZE, np.int64)
        trace.render_rect(*geo, p.camera, p.params, rect, s0, s1, work, stack)
    if work is not acc:
        acc[...] = work


def _check(prepared: Prepared, rect: Rect, s0: int, s1: int, acc: np.ndarray) -> np.ndarray:
    width, height = prepared.settings.width, prepared.settings.height
    if len(rect) != 4 or not all(_is_int(v) for v in rect):
        raise ValueError(f"rect must be four integers (x0, y0, x1, y1), got {rect!r}")
    x0, y0, x1, y1 = rect
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise ValueError(
            f"rect {rect!r} must satisfy 0 <= x0 < x1 <= {width} and 0 <= y0 < y1 <= {height}"
        )
    if not (_is_int(s0) and _is_int(s1) and 0 <= s0 <= s1):
        raise ValueError(f"samples must satisfy 0 <= sample_start <= sample_end, got {s0}, {s1}")
    shape = (y1 - y0, x1 - x0, 3)
    if not isinstance(acc, np.ndarray) or acc.dtype != np.float64 or acc.shape != shape:
        raise ValueError(f"accumulator must be a float64 array of shape {shape}")
    if not acc.flags.writeable:
        raise ValueError("accumulator must be writeable")
    return np.array(rect, np.int64)


def _is_int(v: object) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)
