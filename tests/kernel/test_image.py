"""Tone mapping and encoders: smallpt's curve, deterministic bytes, float image round trip."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import kernel


def test_tonemap_is_smallpt_clamp_and_gamma() -> None:
    radiance = np.array([[[0.0, 0.5, 1.0], [2.0, -1.0, 0.25]]])
    expected = [
        [[0, int(0.5 ** (1 / 2.2) * 255 + 0.5), 255], [255, 0, int(0.25 ** (1 / 2.2) * 255 + 0.5)]]
    ]
    assert kernel.tonemap(radiance * 4, 4).tolist() == expected


def test_png_is_deterministic_top_row_first_and_metadata_free() -> None:
    acc = np.zeros((3, 2, 3))
    acc[0, :, 0] = 8.0  # top row red
    png = kernel.encode_png(acc, 8)
    assert png == kernel.encode_png(acc.copy(), 8)
    image = Image.open(io.BytesIO(png))
    assert image.size == (2, 3) and image.mode == "RGB"
    assert image.getpixel((0, 0)) == (255, 0, 0) and image.getpixel((0, 2)) == (0, 0, 0)
    assert not image.info.keys() - {"dpi", "gamma"} and b"tIME" not in png and b"tEXt" not in png


def test_png_is_lossless() -> None:
    rng = np.random.default_rng(5)
    acc = rng.exponential(0.6, size=(70, 33, 3)) * 4
    decoded = np.asarray(Image.open(io.BytesIO(kernel.encode_png(acc, 4))).convert("RGB"))
    np.testing.assert_array_equal(decoded, kernel.tonemap(acc, 4))


def test_float_image_is_mean_radiance_npy() -> None:
    acc = np.arange(2 * 3 * 3, dtype=np.float64).reshape(2, 3, 3)
    data = kernel.encode_float_image(acc, 4)
    out = np.load(io.BytesIO(data), allow_pickle=False)
    assert out.dtype == np.float32 and out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out, (acc / 4).astype(np.float32))
    assert data == kernel.encode_float_image(acc, 4)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        kernel.tonemap(np.zeros((1, 1, 3)), 0)
    with pytest.raises(ValueError, match="shape"):
        kernel.encode_png(np.zeros((2, 2)), 1)


def _tonemap_by_the_formula(acc: np.ndarray, samples: int) -> np.ndarray:
    """The curve written out step by step, each step a new array (the reference)."""
    mean = np.nan_to_num(acc / float(samples), nan=0.0, posinf=1.0, neginf=0.0)
    return (np.power(np.clip(mean, 0.0, 1.0), 1.0 / 2.2) * 255.0 + 0.5).astype(np.uint8)


def test_in_place_tone_mapping_equals_the_formula_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    acc = rng.exponential(0.6, size=(257, 131, 3)) * 16
    acc.flat[::97] = np.nan
    acc.flat[1::89] = np.inf
    acc.flat[2::83] = -np.inf
    acc.flat[3::79] = -1.0
    acc.flat[4::73] = 0.0  # zeros skip the power
    acc.flat[5::71] = -0.0
    acc.flat[6::67] = 5e-324  # the smallest subnormal: not zero, so it takes the power
    acc.flat[7::61] = 16.0  # exactly 1 after the mean
    before = acc.copy()
    np.testing.assert_array_equal(kernel.tonemap(acc, 16), _tonemap_by_the_formula(acc, 16))
    np.testing.assert_array_equal(acc, before)  # the caller's accumulator is left alone


def test_float_image_and_tonemap_give_the_same_bytes_as_the_two_encoders() -> None:
    rng = np.random.default_rng(11)
    # more rows than two bands and not a multiple of one: the last band is short
    acc = rng.exponential(0.6, size=(2 * kernel.image.BAND_ROWS + 7, 24, 3)) * 8
    before = acc.copy()
    flt, image = kernel.float_image_and_tonemap(acc, 8)
    assert flt == kernel.encode_float_image(acc, 8)
    np.testing.assert_array_equal(image, _tonemap_by_the_formula(acc, 8))
    assert kernel.png_of(image) == kernel.encode_png(acc, 8)
    np.testing.assert_array_equal(acc, before)


def test_display8_is_the_tone_map_or_the_top_byte_of_the_display_image() -> None:
    rng = np.random.default_rng(7)
    acc = rng.uniform(0.0, 3.0, (5, 7, 3)) * 4
    assert (kernel.display8(acc, 4) == kernel.tonemap(acc, 4)).all()
    _, image16 = kernel.float_image_and_display16(acc / 3.0, 4)
    shown = kernel.display8(acc / 3.0, 4, display_referred=True)
    assert shown.dtype == np.uint8 and (shown == image16 >> 8).all()


@pytest.mark.parametrize("display_referred", [False, True])
def test_tiles_converted_apart_and_placed_are_the_frames_bytes(display_referred: bool) -> None:
    """What the finalizer does: each tile's float32 mean and display image converted on its
    own (as it is read ahead), placed into the frame, then encoded: the bytes equal the
    whole frame's conversion (float_image_and_tonemap / float_image_and_display16). Uneven
    tiles over a frame wider than a band, with NaN, infinities, negatives and values past 1."""
    rng = np.random.default_rng(19)
    spp = 7
    acc = rng.exponential(0.7, size=(150, 97, 3)) * spp
    acc[3, 5] = [np.nan, np.inf, -np.inf]
    acc[140, 90] = [-2.0, 0.0, 1e30]
    if display_referred:
        flt, whole = kernel.float_image_and_display16(acc, spp)
        encode = kernel.png16_of
    else:
        flt, whole = kernel.float_image_and_tonemap(acc, spp)
        encode = kernel.png_of
    mean = np.empty(acc.shape, dtype=np.float32)
    image = np.empty(acc.shape, dtype=whole.dtype)
    for y0, y1 in ((0, 64), (64, 130), (130, 150)):
        for x0, x1 in ((0, 40), (40, 97)):
            m, im = kernel.display_images(acc[y0:y1, x0:x1], spp, display_referred=display_referred)
            assert m.dtype == np.float32 and im.dtype == whole.dtype
            mean[y0:y1, x0:x1], image[y0:y1, x0:x1] = m, im
    assert kernel.float_npy(mean) == flt
    np.testing.assert_array_equal(image, whole)
    assert encode(image) == encode(whole)


def _read_png(png: bytes) -> tuple[int, int, np.ndarray]:
    """A writer's file read with the standard library alone: checks the signature, exactly
    IHDR/IDAT/IEND and zlib's CRC of each; returns the bit depth, the one filter type of
    every row, and the rows undone (big-endian samples as bytes, one row per line)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(png):
        (size,) = struct.unpack(">I", png[at : at + 4])
        kind, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + size]
        (crc,) = struct.unpack(">I", png[at + 8 + size : at + 12 + size])
        assert crc == zlib.crc32(kind + data), kind
        chunks.append((kind, data))
        at += 12 + size
    assert [kind for kind, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    w, h, depth, colour, *rest = struct.unpack(">IIBBBBB", chunks[0][1])
    assert colour == 2 and rest == [0, 0, 0] and depth in (8, 16)
    raw = np.frombuffer(zlib.decompress(chunks[1][1]), dtype=np.uint8).reshape(h, -1)
    assert raw.shape[1] == 1 + w * 3 * depth // 8
    kept = int(raw[0, 0])
    assert kept in (0, 2) and (raw[:, 0] == kept).all()
    rows = raw[:, 1:]
    if kept == 2:
        rows = np.cumsum(rows, axis=0, dtype=np.uint8)  # Up undone: modulo 256
    return depth, kept, rows


@pytest.mark.parametrize("depth", [8, 16])
def test_png_keeps_the_shorter_rows_and_they_undo_to_the_image(depth: int) -> None:
    """The rows are deflated unfiltered and with ``Up`` on every row, and the shorter is kept:
    noise (and a frame 1 row high, a tie) unfiltered, a smooth vertical gradient (every row
    the same small step from the one above) filtered. Each file, read back with zlib alone,
    undoes to the image; so do views that are not C-contiguous and, at 16 bits, big-endian
    samples."""
    dtype = np.uint8 if depth == 8 else np.uint16
    encode = kernel.png_of if depth == 8 else kernel.png16_of
    top = np.iinfo(dtype).max
    rng = np.random.default_rng(depth)
    noise = rng.integers(0, top, (37, 23, 3), dtype=dtype, endpoint=True)
    column = np.linspace(0, top, 64, dtype=dtype)[:, None, None]
    smooth = (column + np.zeros((64, 48, 3), dtype)) ^ rng.integers(0, 2, (1, 48, 3), dtype)
    cases = [(noise, 0), (noise[:1], 0), (smooth, 2), (smooth[:, ::2], 2), (smooth.T.T, 2)]
    if depth == 16:
        cases.append((smooth.astype(">u2"), 2))
    for image, kept in cases:
        got_depth, got_kept, rows = _read_png(encode(image))
        assert (got_depth, got_kept) == (depth, kept)
        big_endian = np.dtype(dtype).newbyteorder(">")
        np.testing.assert_array_equal(rows.view(big_endian).reshape(image.shape), image)


def test_png_writers_refuse_what_they_cannot_write() -> None:
    with pytest.raises(
        ValueError, match=r"expected a uint8 \(height, width, 3\) image, got float64"
    ):
        kernel.png_of(np.zeros((2, 2, 3)))
    with pytest.raises(ValueError, match=r"expected a uint16 .* got uint8"):
        kernel.png16_of(np.zeros((2, 2, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"expected a uint16 .* got int16"):
        kernel.png16_of(np.zeros((2, 2, 3), dtype=np.int16))
    with pytest.raises(ValueError, match=r"got uint8 \(2, 2\)"):
        kernel.png_of(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"got uint8 \(0, 2, 3\)"):
        kernel.png_of(np.zeros((0, 2, 3), dtype=np.uint8))
