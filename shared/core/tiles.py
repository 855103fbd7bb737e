"""Tile plans and tile accumulators: pure helpers shared by the scheduler, workers, finalizer.

A job's image is cut into ``tile_size`` squares in row-major order (the last row and column may
be smaller); tile ``i`` is the rectangle ``(x0, y0, x1, y1)``, half-open, row 0 at the top. A
tile's accumulator is the kernel's float64 radiance sum of shape ``(y1-y0, x1-x0, 3)``, stored
as ``.npy`` bytes: a checkpoint, a tile result and the assembled image are all lossless, so a
resumed or re-assembled image is bit-identical to a straight render.
"""

from __future__ import annotations

import functools
import io
import math
import tokenize
from typing import Any

import numpy as np
import numpy.lib.format as npy_format
import numpy.typing as npt

from kernel.rect import Rect
from shared.core.errors import DecodeError

Accumulator = npt.NDArray[np.float64]

_NPY_MAGIC = b"\x93NUMPY"
#: what numpy raises for bytes that are not an .npy array (a mangled header fails to parse
#: as a Python literal: SyntaxError, or TokenError from its fallback filter)
_NPY_ERRORS = (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError)

__all__ = [
    "Accumulator",
    "assemble",
    "fits",
    "from_npy",
    "load_npy",
    "plan_rects",
    "to_npy",
    "zeros_for",
]


def plan_rects(width: int, height: int, tile_size: int) -> list[Rect]:
    """The tiles of a ``width`` x ``height`` image, row-major."""
    if min(width, height, tile_size) < 1:
        raise ValueError(f"bad plan {width}x{height} / {tile_size}")
    return [
        Rect(x, y, min(x + tile_size, width), min(y + tile_size, height))
        for y in range(0, height, tile_size)
        for x in range(0, width, tile_size)
    ]


def zeros_for(rect: Rect) -> Accumulator:
    """An empty accumulator for ``rect``."""
    x0, y0, x1, y1 = rect
    return np.zeros((y1 - y0, x1 - x0, 3), dtype=np.float64)


def to_npy(acc: Accumulator) -> bytes:
    """Lossless ``.npy`` bytes of an accumulator: ``np.save``'s, with the header written by
    numpy once per shape (``np.save`` takes 27 us for an 8x8 tile, nearly all of it
    formatting the header, and a worker writes a result per tile; this takes 1.5 us)."""
    arr = np.ascontiguousarray(acc, dtype=np.float64)
    return _npy_prefix(arr.shape) + arr.tobytes()


@functools.lru_cache(maxsize=64)
def _npy_prefix(shape: tuple[int, ...]) -> bytes:
    """What ``np.save`` writes before the data of a C-ordered float64 array of ``shape``."""
    arr = np.zeros(shape, dtype=np.float64)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()[: buf.tell() - arr.nbytes]


def load_npy(data: bytes) -> Accumulator:
    """Parse ``.npy`` bytes of some accumulator, or raise DecodeError (the array may be read-only).

    :func:`from_npy` also checks the shape against a tile; this is for a reader that learns
    the tile later. The header is parsed by numpy once per distinct header (a frame's tiles
    share a few shapes): ``np.load`` parses it with ``ast.literal_eval`` each time, 100 us
    of an 8x8 tile's 105 (a finalizer reads 4096 of them for a 512x512 frame).
    """
    try:
        shape, fortran, dtype, offset = _npy_header(data[: _npy_header_end(data)])
        count = math.prod(shape)
        flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        arr = flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)
    except _NPY_ERRORS:
        arr = _np_load(data)  # the reason, in numpy's words (or an .npz archive)
    if arr.dtype != np.float64 or arr.ndim != 3 or arr.shape[2] != 3:
        raise DecodeError(f"accumulator has {arr.dtype} {arr.shape}, expected float64 (h, w, 3)")
    acc: Accumulator = arr
    return acc


def _np_load(data: bytes) -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except _NPY_ERRORS as exc:
        raise DecodeError(f"accumulator is not a valid .npy file: {exc}") from exc
    if not isinstance(arr, np.ndarray):  # an .npz archive loads as a lazy NpzFile
        arr.close()
        raise DecodeError("accumulator is an .npz archive, not an .npy array")
    return arr


def _npy_header_end(data: bytes) -> int:
    """Where the data of ``.npy`` bytes start (the magic, the version, the header's length
    and the header); ValueError for anything else."""
    if data[:6] != _NPY_MAGIC or len(data) < 12:
        raise ValueError("not .npy")
    size = 2 if data[6] == 1 else 4  # version 1.0: a 2-byte length; 2.0 and 3.0: 4 bytes
    return 8 + size + int.from_bytes(data[8 : 8 + size], "little")


@functools.lru_cache(maxsize=64)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """(shape, Fortran order, dtype, data offset) of an ``.npy`` header, parsed by numpy."""
    fp = io.BytesIO(header)
    version = npy_format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = npy_format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, fortran, dtype = npy_format.read_array_header_2_0(fp)
    else:
        raise ValueError(f".npy version {version}: left to np.load")
    if dtype.hasobject or fp.tell() != len(header):
        raise ValueError("left to np.load")
    return shape, fortran, dtype, len(header)


def fits(acc: Accumulator, rect: Rect) -> bool:
    """True if ``acc`` has the shape of ``rect``'s accumulator."""
    x0, y0, x1, y1 = rect
    return acc.shape == (y1 - y0, x1 - x0, 3)


def from_npy(data: bytes, rect: Rect) -> Accumulator:
    """Parse ``.npy`` bytes into an accumulator of ``rect``'s shape, or raise DecodeError."""
    arr = load_npy(data)
    if not fits(arr, rect):
        expected = zeros_for(rect).shape
        raise DecodeError(f"accumulator has {arr.dtype} {arr.shape}, expected float64 {expected}")
    out: Accumulator = np.array(arr, dtype=np.float64, copy=True)
    return out


def assemble(width: int, height: int, parts: list[tuple[Rect, Accumulator]]) -> Accumulator:
    """Place tile accumulators into one full-frame accumulator."""
    full = np.zeros((height, width, 3), dtype=np.float64)
    for (x0, y0, x1, y1), acc in parts:
        full[y0:y1, x0:x1] = acc
    return full
