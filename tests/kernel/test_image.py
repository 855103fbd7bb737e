"""Tone mapping and encoders: smallpt's curve, deterministic bytes, float image round trip."""

from __future__ import annotations

import io

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
