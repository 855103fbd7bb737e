"""The resume guarantee: any split of samples, any tiling and either variant give the same bits."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from tests.kernel.conftest import SPP, full, prepared, same_bits

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", kernel.BUILTIN_SCENES)
@pytest.mark.parametrize("k", [0, 1, 3, 4, 7, SPP])
def test_resume_at_any_split_is_bit_identical(name: str, k: int) -> None:
    p = prepared(name)
    straight = full(p, 0, SPP)
    resumed = full(p, 0, k)
    kernel.render_full(p, k, SPP, resumed, parallel=False)
    assert same_bits(straight, resumed)
    assert kernel.encode_png(straight, SPP) == kernel.encode_png(resumed, SPP)
    assert kernel.encode_float_image(straight, SPP) == kernel.encode_float_image(resumed, SPP)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(kernel.BUILTIN_SCENES),
    splits=st.lists(st.integers(0, SPP), max_size=4),
)
def test_resume_through_many_checkpoints(name: str, splits: list[int]) -> None:
    p = prepared(name)
    points = [0, *sorted(splits), SPP]
    acc = np.zeros((p.settings.height, p.settings.width, 3))
    for a, b in itertools.pairwise(points):
        kernel.render_tile(p, kernel.Rect(0, 0, p.settings.width, p.settings.height), a, b, acc)
    assert same_bits(acc, full(p, 0, SPP))


def _tiles(
    width: int, height: int, xs: list[int], ys: list[int]
) -> list[tuple[int, int, int, int]]:
    cx = [0, *sorted(set(xs)), width]
    cy = [0, *sorted(set(ys)), height]
    return [
        (x0, y0, x1, y1) for y0, y1 in itertools.pairwise(cy) for x0, x1 in itertools.pairwise(cx)
    ]


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(kernel.BUILTIN_SCENES),
    xs=st.lists(st.integers(1, 23), max_size=3),
    ys=st.lists(st.integers(1, 15), max_size=3),
    k=st.integers(0, SPP),
)
def test_assembled_tiles_equal_full_frame(name: str, xs: list[int], ys: list[int], k: int) -> None:
    p = prepared(name)
    w, h = p.settings.width, p.settings.height
    assembled = np.zeros((h, w, 3))
    for x0, y0, x1, y1 in _tiles(w, h, xs, ys):
        tile = np.zeros((y1 - y0, x1 - x0, 3))
        kernel.render_tile(p, kernel.Rect(x0, y0, x1, y1), 0, k, tile)
        kernel.render_tile(p, kernel.Rect(x0, y0, x1, y1), k, SPP, tile)
        assembled[y0:y1, x0:x1] = tile
    assert same_bits(assembled, full(p, 0, SPP, parallel=False))
    assert same_bits(assembled, full(p, 0, SPP, parallel=True))


def test_tile_into_a_view_of_the_full_accumulator() -> None:
    p = prepared("cornell")
    acc = np.zeros((p.settings.height, p.settings.width, 3))
    kernel.render_tile(p, kernel.Rect(5, 3, 17, 11), 0, SPP, acc[3:11, 5:17])
    assert same_bits(acc[3:11, 5:17], full(p, 0, SPP)[3:11, 5:17])
    assert not acc[:3].any()


@pytest.mark.parametrize("name", kernel.BUILTIN_SCENES)
def test_parallel_equals_serial_at_odd_sizes(name: str) -> None:
    p = prepared(name, 0, 19, 13)
    assert same_bits(full(p, 2, 5, parallel=True), full(p, 2, 5, parallel=False))


def test_frames_and_seeds_differ_but_repeat() -> None:
    doc = kernel.builtin_scene("spheres")
    a = kernel.prepare(doc, 3, kernel.RenderSettings(16, 12, 2))
    again = kernel.prepare(kernel.builtin_scene("spheres"), 3, kernel.RenderSettings(16, 12, 2))
    other_frame = kernel.prepare(doc, 4, kernel.RenderSettings(16, 12, 2))
    other_seed = kernel.prepare(doc, 3, kernel.RenderSettings(16, 12, 2, seed=1))
    assert same_bits(full(a, 0, 2), full(again, 0, 2))
    assert not same_bits(full(a, 0, 2), full(other_frame, 0, 2))
    assert not same_bits(full(a, 0, 2), full(other_seed, 0, 2))


IMAGE_HASH = """
import hashlib, sys, numpy as np, kernel
frame = int(sys.argv[1])
p = kernel.prepare(kernel.builtin_scene("cornell"), frame, kernel.RenderSettings(20, 15, 4))
acc = np.zeros((15, 20, 3))
kernel.render_full(p, 0, 4, acc)
png = kernel.encode_png(acc, 4)
key = kernel.input_hash(kernel.builtin_scene("cornell"), frame, p.settings)
print(hashlib.sha256(acc.tobytes() + png).hexdigest(), key)
"""


def _image_hash(frame: int) -> str:
    out = subprocess.run(
        [sys.executable, "-c", IMAGE_HASH, str(frame)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=100,
    )
    return out.stdout.strip()


def test_separate_processes_agree_and_frames_differ() -> None:
    first, second, other = _image_hash(1), _image_hash(1), _image_hash(2)
    assert first == second
    assert first.split()[0] != other.split()[0]
    assert first.split()[1] != other.split()[1]
    here = hashlib.sha256()
    p = kernel.prepare(kernel.builtin_scene("cornell"), 1, kernel.RenderSettings(20, 15, 4))
    acc = full(p, 0, 4)
    here.update(acc.tobytes() + kernel.encode_png(acc, 4))
    assert first.split()[0] == here.hexdigest()
