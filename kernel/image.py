"""Accumulator → images. Tone mapping is smallpt's: clamp the mean radiance to [0, 1], apply
gamma 1/2.2, scale to 0..255 and round half up (``int(x ** (1 / 2.2) * 255 + 0.5)``).

PNG bytes are deterministic: RGB, no chunk but ``IHDR``/``IDAT``/``IEND`` (no timestamps, text or
colour profile). The rows are deflated by ISA-L (``isal``) at :data:`PNG_LEVEL` twice, as they
are and with PNG's ``Up`` filter on every row, and the shorter stream is kept: the first wins on
noisy renders, the second on smooth ones. Pillow chose a filter per row by trying four, then
zlib deflated them with ``Z_RLE``, and half of its time was the choice. 512x512 cornell frames,
Pillow against this (``python -m bench.png``): 1 spp 49.9 against 59.1 KB, 4 spp 185 against
180 KB, 16 spp 509 against 472 KB, 64 spp 753 against 724 KB in 17.6 against 4.0 ms; a smooth
frame 147 against 165 KB.
A finalizer encodes a PNG per frame, in the job's tail, and the gateway one per preview. The
same pixels give the same bytes on one host; ISA-L picks its code by CPU at run time, so hosts of
different CPU generations may write different bytes for them, as two zlib versions could.
The float image is the mean radiance as a float32 ``.npy`` (no pickle), for compositing.

A *display-referred* accumulator (POV-Ray's: its values already carry POV-Ray's gamma, as
``value / 65535`` per sample) is not tone-mapped: :func:`float_image_and_display16` rounds the
mean back to POV-Ray's 16-bit integers and :func:`png16_of` writes them as a 16-bit RGB PNG,
equal pixel for pixel to what ``povray +FN16`` writes, by the same writer as the 8-bit one.

Frames are converted in bands of :data:`BAND_ROWS` rows: each step of the curve then works on a
band that stays in the CPU cache, and no frame-sized float64 temporary is allocated (in the
finalizer of ``bench/pipeline.py`` (a), 512x512: 4-10 ms instead of 7-18). Every step is per
element, so the bytes are the same as converting the frame at once.
"""

from __future__ import annotations

import io
import struct

import numpy as np
from isal import isal_zlib

GAMMA = 2.2
#: ISA-L's deflate level (0-3) of a PNG's rows: at 1, as small as zlib's ``Z_RLE`` on renders
PNG_LEVEL = 1
#: rows converted at a time (a band of a 512-wide frame is 768 KiB of float64)
BAND_ROWS = 64


def _checked(accumulator: np.ndarray, samples: int) -> np.ndarray:
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    acc = np.asarray(accumulator)
    if acc.ndim != 3 or acc.shape[2] != 3 or acc.shape[0] < 1 or acc.shape[1] < 1:
        raise ValueError(f"accumulator must have shape (height, width, 3), got {acc.shape}")
    return acc


def _mean(acc: np.ndarray, samples: int) -> np.ndarray:
    """The mean radiance of a checked accumulator: a new float64 array."""
    mean: np.ndarray = acc.astype(np.float64, copy=False) / float(samples)
    return mean


def _tonemap_in_place(mean: np.ndarray, out: np.ndarray) -> None:
    """Tone-map a mean radiance array into the 8-bit ``out``, overwriting ``mean``.

    ``fmax``/``fmin`` ignore NaN, so the two of them clamp and send NaN to 0 and ±inf to 1 / 0
    in one pass each. ``power`` skips the zeros (``0 ** (1/2.2)`` is 0): NumPy's vector
    ``power`` takes a slow path for them, and a render is often half black.
    """
    np.fmax(mean, 0.0, out=mean)
    np.fmin(mean, 1.0, out=mean)
    np.power(mean, 1.0 / GAMMA, out=mean, where=mean > 0.0)
    np.multiply(mean, 255.0, out=mean)
    np.add(mean, 0.5, out=mean)
    np.copyto(out, mean, casting="unsafe")  # truncates, as ``astype(np.uint8)``


def _convert(acc: np.ndarray, samples: int, mean_out: np.ndarray | None = None) -> np.ndarray:
    """The 8-bit image of a checked accumulator, band by band; the float32 mean goes to
    ``mean_out`` if given."""
    image = np.empty(acc.shape, dtype=np.uint8)
    for y0 in range(0, acc.shape[0], BAND_ROWS):
        band = _mean(acc[y0 : y0 + BAND_ROWS], samples)
        if mean_out is not None:
            mean_out[y0 : y0 + BAND_ROWS] = band  # float32, as ``astype(np.float32)``
        _tonemap_in_place(band, image[y0 : y0 + BAND_ROWS])
    return image


def tonemap(accumulator: np.ndarray, samples: int) -> np.ndarray:
    """8-bit sRGB-ish image (height, width, 3) of the mean of ``samples`` summed samples."""
    return _convert(_checked(accumulator, samples), samples)


def png_of(image: np.ndarray) -> bytes:
    """PNG bytes of an 8-bit (height, width, 3) image, as :func:`encode_png` writes them."""
    return _png(image, np.uint8)


def encode_png(accumulator: np.ndarray, samples: int) -> bytes:
    """PNG bytes of :func:`tonemap`; identical inputs give identical bytes."""
    return png_of(tonemap(accumulator, samples))


def _npy(mean: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, mean.astype(np.float32, copy=False), allow_pickle=False)
    return buf.getvalue()


def encode_float_image(accumulator: np.ndarray, samples: int) -> bytes:
    """``.npy`` bytes of the float32 mean radiance, shape (height, width, 3)."""
    return _npy(_mean(_checked(accumulator, samples), samples))


def float_image_and_tonemap(accumulator: np.ndarray, samples: int) -> tuple[bytes, np.ndarray]:
    """:func:`encode_float_image` and :func:`tonemap` from one pass over the accumulator.

    The PNG is then :func:`png_of` the image (the slow part, which can run beside writing the
    float image); the bytes equal :func:`encode_png`'s.
    """
    acc = _checked(accumulator, samples)
    mean = np.empty(acc.shape, dtype=np.float32)
    image = _convert(acc, samples, mean)
    return _npy(mean), image


def display_images(
    accumulator: np.ndarray, samples: int, *, display_referred: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The float32 mean and the display image of an accumulator, a frame's or a tile's: the
    8-bit tone-mapped image (:func:`tonemap`) for linear radiance, the 16-bit one
    (:func:`float_image_and_display16`) for a display-referred accumulator.

    Every step is per element, so tiles converted apart and placed side by side are the
    frame's arrays bit for bit: the finalizer converts each tile as it reads it ahead, while
    the others render, and at finalization only places them (:func:`float_npy` and
    :func:`png_of` / :func:`png16_of` of the frames give :func:`float_image_and_tonemap`'s and
    :func:`float_image_and_display16`'s bytes).
    """
    acc = _checked(accumulator, samples)
    if display_referred:
        mean = _mean(acc, samples)
        return mean.astype(np.float32), _display16_in_place(mean)
    mean32 = np.empty(acc.shape, dtype=np.float32)
    return mean32, _convert(acc, samples, mean32)


def float_npy(mean: np.ndarray) -> bytes:
    """``.npy`` bytes of a float32 mean radiance (the float image)."""
    return _npy(mean)


def float_image_and_display16(accumulator: np.ndarray, samples: int) -> tuple[bytes, np.ndarray]:
    """The float image and the 16-bit image of a display-referred accumulator (no tone curve).

    The 16-bit value of a pixel is ``rint(clip(mean, 0, 1) * 65535)``: for an accumulator
    holding ``v / 65535 * samples`` (POV-Ray's 16-bit ``v``), the mean is within an ulp of
    ``v / 65535``, so this gives back ``v`` exactly.
    """
    acc = _checked(accumulator, samples)
    mean = _mean(acc, samples)
    flt = _npy(mean)
    return flt, _display16_in_place(mean)


def _display16_in_place(mean: np.ndarray) -> np.ndarray:
    """The 16-bit image of a display-referred mean (overwritten)."""
    np.nan_to_num(mean, copy=False, nan=0.0)
    np.clip(mean, 0.0, 1.0, out=mean)
    np.multiply(mean, 65535.0, out=mean)
    np.rint(mean, out=mean)
    return mean.astype(np.uint16)


def display8(
    accumulator: np.ndarray, samples: int, *, display_referred: bool = False
) -> np.ndarray:
    """The 8-bit image a person sees of an accumulator: :func:`tonemap` for linear radiance,
    the top byte of the 16-bit image for a display-referred one (what the finalizer's PNG shows,
    at 8 bits). For previews, which mix tiles of different sample counts: one call per tile."""
    if not display_referred:
        return tonemap(accumulator, samples)
    image16 = _display16_in_place(_mean(_checked(accumulator, samples), samples))
    return (image16 >> 8).astype(np.uint8)


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = isal_zlib.crc32(data, isal_zlib.crc32(kind))  # (zlib's: over ten times as long)
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def png16_of(image: np.ndarray) -> bytes:
    """PNG bytes of a 16-bit (height, width, 3) image (POV-Ray's); identical inputs give
    identical bytes."""
    return _png(image, np.uint16)


def _png(image: np.ndarray, dtype: type[np.uint8] | type[np.uint16]) -> bytes:
    """PNG bytes of an RGB image of ``dtype`` (8 or 16 bits per channel, big-endian in the
    file): its rows deflated at :data:`PNG_LEVEL` twice, unfiltered and with PNG's ``Up``
    filter, and the shorter kept (the unfiltered one if they tie). The filtered rows and both
    streams are held at once: at the peak about three times the image's bytes (Pillow streamed
    its rows), small beside the float frame a finalizer holds."""
    kind = image.dtype.kind, image.dtype.itemsize  # (either byte order: big-endian is written)
    shaped = image.ndim == 3 and image.shape[2] == 3 and 0 not in image.shape
    if kind != ("u", np.dtype(dtype).itemsize) or not shaped:
        raise ValueError(f"expected a {np.dtype(dtype).name} (height, width, 3) image, got "
                         f"{image.dtype} {image.shape}")  # fmt: skip
    h, w = image.shape[:2]
    depth = 8 * np.dtype(dtype).itemsize
    rows = np.ascontiguousarray(image, dtype=np.dtype(dtype).newbyteorder(">"))
    rows = rows.view(np.uint8).reshape(h, -1)
    filtered = np.empty((h, rows.shape[1] + 1), dtype=np.uint8)
    filtered[:, 0] = 0  # PNG filter 0 (None)
    filtered[:, 1:] = rows
    plain = isal_zlib.compress(filtered, PNG_LEVEL)
    filtered[:, 0] = 2  # PNG filter 2 (Up): each byte minus the one above, modulo 256
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])
    up = isal_zlib.compress(filtered, PNG_LEVEL)
    header = struct.pack(">IIBBBBB", w, h, depth, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", min(plain, up, key=len))
        + _chunk(b"IEND", b"")
    )
