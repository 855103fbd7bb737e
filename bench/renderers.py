"""Renderer benchmark (not a test): a frame rendered whole by the renderer vs tiled through ours.

Run: ``python -m bench.renderers [--blender-only | --povray-only]``. Standalone, without the
services: the same 2 cores rendering

- Blender: the demo scene (``services/cli/demo_blend.py``), 640x480, 128 spp, Cycles on the CPU,
  (a) ``blender -b demo.blend -f 1`` with 2 threads, vs (b) 64x64 tiles through
  :class:`BlenderRenderer` with 2 slots of 1 thread, passes of 32 samples (start-up included);
- POV-Ray: the test scene, 640x480, ``+A0.1 +R3``, (a) ``povray`` with 2 threads vs (b) 64x64
  and 128x128 tiles through :class:`PovrayRenderer`, 2 processes of 1 thread at a time.

Printed: wall seconds of each, the ratio tiled / whole, and how far the images are apart.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from services.worker.renderers.blender import BlenderRenderer, BlenderScene, read_exr_rgb
from services.worker.renderers.povray import PovrayRenderer, PovrayScene, read_ppm16
from shared.core.tiles import Accumulator, assemble, plan_rects, zeros_for

ROOT = Path(__file__).resolve().parents[1]
W, H, SPP, TILE, PASS, SLOTS = 640, 480, 128, 64, 32, 2
POV_AA = ("+A0.1", "+R3")
WHOLE_SETTINGS = f"""
import bpy
s = bpy.context.scene
s.render.engine = 'CYCLES'
s.cycles.device = 'CPU'
s.cycles.use_adaptive_sampling = False
s.cycles.use_denoising = False
s.cycles.samples = {SPP}
s.render.resolution_x, s.render.resolution_y, s.render.resolution_percentage = {W}, {H}, 100
s.render.threads_mode = 'FIXED'
s.render.threads = {SLOTS}
f = s.render.image_settings
f.file_format, f.color_depth, f.color_mode = 'OPEN_EXR', '32', 'RGBA'
"""


async def _tiled(
    renderer: BlenderRenderer | PovrayRenderer, scene: object, tile: int, slots: int = SLOTS
) -> Accumulator:
    rects = plan_rects(W, H, tile)
    accs = [zeros_for(r) for r in rects]
    queue = list(zip(rects, accs, strict=True))

    async def slot() -> None:
        while queue:
            rect, acc = queue.pop(0)
            start = 0
            for end in renderer.passes(_Job(SPP)):
                await renderer.render(scene, rect, start, end, acc)  # type: ignore[arg-type]
                start = end

    await asyncio.gather(*(slot() for _ in range(slots)))
    return assemble(W, H, list(zip(rects, accs, strict=True)))


class _Job:
    def __init__(self, spp: int) -> None:
        self.spp = spp
        self.scene: dict[str, object] = {"samples_per_pass": PASS}


def bench_blender(tmp: Path) -> None:
    blend = tmp / "demo.blend"
    script = ROOT / "services" / "cli" / "demo_blend.py"
    build = ["blender", "-b", "--factory-startup", "--python", str(script), "--", str(blend)]
    subprocess.run(build, check=True, capture_output=True)
    t0 = time.perf_counter()
    whole_argv = ["blender", "-b", str(blend), "--python-expr", WHOLE_SETTINGS]
    whole_argv += ["-o", str(tmp / "whole_####"), "-F", "OPEN_EXR", "-f", "1"]
    subprocess.run(whole_argv, check=True, capture_output=True)
    whole_s = time.perf_counter() - t0
    whole = read_exr_rgb(tmp / "whole_0001.exr").astype(np.float64)

    async def tiled() -> Accumulator:
        renderer = BlenderRenderer(slots=SLOTS, samples_per_pass=PASS)
        try:
            return await _tiled(renderer, BlenderScene(blend, 1, W, H, SPP), TILE)
        finally:
            await renderer.close()

    t0 = time.perf_counter()
    image = asyncio.run(tiled()) / SPP
    tiled_s = time.perf_counter() - t0
    diff = np.abs(image - whole).max()
    print(
        f"blender {W}x{H} {SPP} spp: whole `blender -b -f` {whole_s:.1f} s (2 threads); tiled"
        f" {TILE}x{TILE}, passes of {PASS}, {SLOTS} slots {tiled_s:.1f} s;"
        f" ratio {tiled_s / whole_s:.2f}; max |diff| {diff:.2e} (split passes vs one)"
    )


def bench_povray(tmp: Path) -> None:
    scenes = ROOT / "tests" / "renderers" / "scenes"
    for src in scenes.iterdir():
        (tmp / src.name).write_bytes(src.read_bytes())
    pov = tmp / "scene.pov"
    t0 = time.perf_counter()
    argv = ["povray", "-D", "+Iscene.pov", "+Owhole.ppm", "+FP16", f"+W{W}", f"+H{H}", "-J"]
    subprocess.run([*argv, "+WT2", *POV_AA], cwd=tmp, check=True, capture_output=True)
    whole_s = time.perf_counter() - t0
    whole = read_ppm16(tmp / "whole.ppm")
    # A POV-Ray process spends about 0.65 s in the front end's timed waits (not CPU), so more
    # processes than cores hide it.
    for tile, slots in ((TILE, SLOTS), (TILE, 4 * SLOTS), (2 * TILE, SLOTS), (2 * TILE, 4 * SLOTS)):
        renderer = PovrayRenderer(slots=slots)
        t0 = time.perf_counter()
        acc = asyncio.run(_tiled(renderer, PovrayScene(pov, W, H, SPP, POV_AA), tile, slots))
        tiled_s = time.perf_counter() - t0
        differ = int((np.rint(acc / SPP * 65535).astype(np.uint16) != whole).any(axis=2).sum())
        print(
            f"povray {W}x{H} +A0.1 +R3: whole {whole_s:.2f} s (2 threads); tiled {tile}x{tile},"
            f" {slots} processes of 1 thread {tiled_s:.2f} s; ratio {tiled_s / whole_s:.2f};"
            f" pixels that differ from the whole frame: {differ}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blender-only", action="store_true")
    parser.add_argument("--povray-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        if not args.povray_only:
            bench_blender(Path(tmp))
        if not args.blender_only:
            bench_povray(Path(tmp))


if __name__ == "__main__":
    main()
