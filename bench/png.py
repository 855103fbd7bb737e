"""PNG encoders side by side: the kernel's writer against Pillow's, on rendered frames.

Run as ``python -m bench.png`` from the repository root. Renders ``cornell`` at 512x512 (every
core, numba) at 1, 4, 16 and 64 spp, and a smooth frame (the 64 spp one blurred), tone-maps
each, then times :func:`kernel.image.png_of` (ISA-L, unfiltered or ``Up``, the shorter kept)
against Pillow (a filter chosen per row from four, zlib with ``Z_RLE`` at level 6: what the
finalizer used before) on one thread, interleaved, best and median of ``--repeat`` runs each,
and prints both sizes and the ratios. Both files are decoded back and checked pixel for pixel.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import zlib
from collections.abc import Callable

import numpy as np
from PIL import Image, ImageFilter

import kernel
import kernel.image


def pillow_png(image: np.ndarray) -> bytes:
    """The 8-bit PNG as the finalizer wrote it until ISA-L: Pillow, ``Z_RLE``, level 6."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=6, compress_type=zlib.Z_RLE)
    return buf.getvalue()


def frames(side: int) -> dict[str, np.ndarray]:
    """The 8-bit frames compared: cornell at a few sample counts, and a smooth one."""
    settings = kernel.RenderSettings(width=side, height=side, spp=64, seed=0)
    prepared = kernel.prepare(kernel.builtin_scene("cornell"), 0, settings)
    out: dict[str, np.ndarray] = {}
    acc = np.zeros((side, side, 3))
    done = 0
    for spp in (1, 4, 16, 64):
        kernel.render_full(prepared, done, spp, acc, parallel=True)
        done = spp
        out[f"cornell {spp} spp"] = kernel.tonemap(acc, spp)
    blurred = Image.fromarray(out["cornell 64 spp"]).filter(ImageFilter.GaussianBlur(6))
    out["smooth (blurred)"] = np.asarray(blurred)
    return out


def seconds(encode: Callable[[np.ndarray], bytes], image: np.ndarray) -> tuple[float, bytes]:
    """One encode's CPU seconds on this thread, and its bytes."""
    start = time.thread_time()
    data = encode(image)
    return time.thread_time() - start, data


def main() -> None:
    """Time and size both encoders on every frame; print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=512, help="frame edge in pixels")
    parser.add_argument("--repeat", type=int, default=9, help="encodes of each, interleaved")
    args = parser.parse_args()
    print(f"{'frame':18s} {'Pillow ms':>10s} {'ISA-L ms':>9s} {'time B/A':>9s} "
          f"{'Pillow KB':>10s} {'ISA-L KB':>9s} {'size B/A':>9s}")  # fmt: skip
    for name, image in frames(args.side).items():
        a: list[float] = []
        b: list[float] = []
        for _ in range(args.repeat):
            took, old = seconds(pillow_png, image)
            a.append(took)
            took, new = seconds(kernel.image.png_of, image)
            b.append(took)
        for data in (old, new):
            decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            if not np.array_equal(decoded, image):
                raise SystemExit(f"{name}: a PNG did not decode to its frame")
        print(
            f"{name:18s} {1000 * min(a):10.2f} {1000 * min(b):9.2f} "
            f"{statistics.median(b) / statistics.median(a):9.3f} {len(old) / 1000:10.1f} "
            f"{len(new) / 1000:9.1f} {len(new) / len(old):9.3f}"
        )
    print("times: best of each; time B/A: ratio of the medians (B = the kernel's writer)")


if __name__ == "__main__":
    main()
