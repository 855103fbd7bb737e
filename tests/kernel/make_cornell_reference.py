"""Regenerate ``cornell_reference.json`` from the C++ smallpt in bench/smallpt/ (needs g++).

    .venv/bin/python -m tests.kernel.make_cornell_reference

Renders smallpt's own scene with smallpt itself (g++ -O3) at 64x48, 4096 spp, and records
brightness statistics of its 8-bit output: the whole-image mean, the per-channel means and the
means of a 3x4 grid of blocks. test_reference.py checks the kernel's ``cornell`` against them.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.kernel import compile_smallpt, run_smallpt

WIDTH, HEIGHT, SPP = 64, 48, 4096
GRID = (3, 4)
OUT = Path(__file__).with_name("cornell_reference.json")


def statistics(image: np.ndarray) -> dict[str, Any]:
    """Brightness statistics of an 8-bit (h, w, 3) image, scaled to [0, 1]."""
    x = image.astype(np.float64) / 255.0
    rows, cols = GRID
    blocks = x.reshape(rows, x.shape[0] // rows, cols, x.shape[1] // cols, 3).mean(axis=(1, 3, 4))
    return {
        "mean": round(float(x.mean()), 6),
        "channel_means": [round(float(v), 6) for v in x.mean(axis=(0, 1))],
        "block_means": [[round(float(v), 6) for v in row] for row in blocks],
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_smallpt(Path(tmp))
        ppm = Path(tmp) / "cornell.ppm"
        run_smallpt(exe, WIDTH, HEIGHT, SPP, ppm)
        image = np.asarray(Image.open(ppm).convert("RGB"))
    doc = {
        "generated_by": "python -m tests.kernel.make_cornell_reference",
        "source": "bench/smallpt/smallpt.cpp built with g++ -O3",
        "width": WIDTH,
        "height": HEIGHT,
        "spp": SPP,
        "grid": list(GRID),
        **statistics(image),
    }
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
