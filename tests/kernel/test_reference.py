"""The cornell scene is a plausible smallpt image: its brightness matches C++ smallpt's.

The reference numbers come from bench/smallpt/smallpt.cpp at 4096 spp (see
make_cornell_reference.py); ours is rendered at 256 spp, so the tolerances allow for noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import kernel
from tests.kernel.make_cornell_reference import statistics

REFERENCE = json.loads(Path(__file__).with_name("cornell_reference.json").read_text())
SPP = 256


def test_cornell_brightness_matches_cpp_smallpt() -> None:
    w, h = REFERENCE["width"], REFERENCE["height"]
    p = kernel.prepare(kernel.builtin_scene("cornell"), 0, kernel.RenderSettings(w, h, SPP))
    acc = np.zeros((h, w, 3))
    kernel.render_full(p, 0, SPP, acc)
    ours = statistics(kernel.tonemap(acc, SPP))
    assert abs(ours["mean"] / REFERENCE["mean"] - 1) < 0.03
    np.testing.assert_allclose(ours["channel_means"], REFERENCE["channel_means"], rtol=0.04)
    np.testing.assert_allclose(ours["block_means"], REFERENCE["block_means"], rtol=0.08)
