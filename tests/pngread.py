"""A small PNG reader for tests: 8- and 16-bit RGB/RGBA, every filter, no interlace.

Pillow reads a 16-bit RGB PNG as 8-bit, so the 16-bit images of POV-Ray jobs (and
``povray +FN16``'s own) are compared with this instead.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["read_png"]


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(kind: int, row: bytearray, prev: bytes, bpp: int) -> None:
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            row[i] = (row[i] + a) & 0xFF
        elif kind == 2:
            row[i] = (row[i] + b) & 0xFF
        elif kind == 3:
            row[i] = (row[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            row[i] = (row[i] + _paeth(a, b, c)) & 0xFF
        elif kind != 0:
            raise ValueError(f"PNG filter {kind}")


def read_png(data: bytes) -> np.ndarray:
    """The pixels of ``data`` as (height, width, 3) uint8 or uint16 (alpha dropped)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        assert (
            zlib.crc32(kind + body)
            == struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        )
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    w, h, depth, color, _, _, interlace = header
    assert color in (2, 6) and depth in (8, 16) and interlace == 0, header
    channels = 3 if color == 2 else 4
    bpp = channels * depth // 8
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = bytearray()
    prev = bytes(stride)
    for y in range(h):
        start = y * (stride + 1)
        row = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(raw[start], row, prev, bpp)
        out += row
        prev = bytes(row)
    dtype = ">u2" if depth == 16 else np.uint8
    pixels = np.frombuffer(bytes(out), dtype=dtype).reshape(h, w, channels)[:, :, :3]
    return pixels.astype(np.uint16 if depth == 16 else np.uint8)
