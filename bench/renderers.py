"""Renderer benchmark (not a test): a frame rendered whole by the renderer vs tiled through ours.

Run: ``python -m bench.renderers [--blender-only | --povray-only] [--standalone]``.

End to end (the default): the embedded stack and the four services as processes (one worker,
``TESSERA_WORKER_SLOTS=2``: two Blender processes of one thread, or up to
``TESSERA_POVRAY_PROCESSES`` POV-Ray processes, by default its 4 tiles in hand), the scene
uploaded as an asset and the job submitted as ``tessera submit`` does, timed from the upload
to the job-completed event (the PNG and float image written), vs the renderer's own full-frame
run on the same 2 cores:

- Blender: the demo scene, 640x480, 128 spp, Cycles on the CPU, ``blender -b demo.blend -f 1``
  with 2 threads vs Tessera with one pass per tile (the float image then equals Blender's EXR
  value for value: checked) and with passes of 32 samples (checkpointed, not exact);
- POV-Ray: the test scene with an include, 640x480, ``+A0.1 +R3``, ``povray +WT2 +FN16`` vs
  Tessera (its 16-bit PNG equals POV-Ray's pixel for pixel: checked) at several tile sizes,
  with the default 4 POV-Ray processes and with 8 (``TESSERA_POVRAY_PROCESSES=8`` and
  ``TESSERA_WORKER_IN_HAND=8``; the worker is restarted for it, outside the timing).

``--standalone`` adds the renderer-only comparison without the services: the same 2 cores
rendering

- Blender: the demo scene (``services/cli/demo_blend.py``), 640x480, 128 spp, Cycles on the CPU,
  (a) ``blender -b demo.blend -f 1`` with 2 threads, vs (b) 64x64 tiles through
  :class:`BlenderRenderer` with 2 slots of 1 thread, passes of 32 samples (start-up included);
- POV-Ray: the test scene, 640x480, ``+A0.1 +R3``, (a) ``povray`` with 2 threads vs (b) 64x64
  and 128x128 tiles through :class:`PovrayRenderer`, 2 processes of 1 thread at a time.

Printed: wall seconds of each, the ratio tiled / whole, and how far the images are apart. The
machine may be shared: run it on an idle one for figures to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from nats.aio.msg import Msg

from proto.api import SubmitRequest
from proto.names import EventKind, Names
from services.cli.demo_scenes import build_demo_blend
from services.cli.local import ServiceProcesses
from services.client.api import GatewayUnavailable, TesseraClient
from services.client.assets import upload_scene
from services.worker.renderers.blender import BlenderRenderer, BlenderScene, read_exr_rgb
from services.worker.renderers.povray import PovrayRenderer, PovrayScene, read_ppm16
from shared.core.config import Settings
from shared.core.tiles import Accumulator, assemble, plan_rects, zeros_for
from shared.devstack.stack import Stack
from shared.nats.jetstream import connect_nats
from tests.pngread import read_png

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
    blend = build_demo_blend(tmp / "demo.blend")
    t0 = time.perf_counter()
    whole_argv = ["blender", "-b", "-noaudio", str(blend), "--python-expr", WHOLE_SETTINGS]
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


# ------------------------------------------------------------------------------ end to end


async def _e2e_job(
    env: Mapping[str, str], scene: Path, renderer: str, fields: dict[str, Any]
) -> tuple[float, float, bytes, bytes]:
    """Upload ``scene``, submit, wait for job-completed: (upload s, total s, PNG, float)."""
    settings = Settings.from_env(env)
    names = Names(settings.deployment.namespace)
    nc = await connect_nats(settings, name="bench-renderers")
    try:
        client = TesseraClient(nc, names, timeout=120)
        for _ in range(600):  # the gateway may still be starting (bounded: 60 s)
            try:
                await client.asset_missing([])
                break
            except GatewayUnavailable:
                await asyncio.sleep(0.1)
        done = asyncio.Event()

        async def on_event(msg: Msg) -> None:
            done.set()

        sub = await nc.subscribe(names.event_filter(EventKind.JOB_COMPLETED), cb=on_event)
        start = time.perf_counter()
        asset, main = await upload_scene(client, scene, renderer, False)
        uploaded = time.perf_counter() - start
        options = fields.pop("options")  # (the caller's dict: pass a copy)
        request = SubmitRequest(  # a new job each run, even for the same request
            project="bench",
            renderer=renderer,
            scene={"asset": asset, "main": main, **options},
            idempotency_key=f"bench-{uuid.uuid4().hex}",
            **fields,
        )
        reply = await client.submit(request)
        await asyncio.wait_for(done.wait(), 1800)
        total = time.perf_counter() - start
        await sub.unsubscribe()
        png = await client.download(reply["job_id"], kind="png")
        flt = await client.download(reply["job_id"], kind="float")
        return uploaded, total, png, flt
    finally:
        await nc.close()


def _line(what: str, direct: float, upload: float, total: float, check: str) -> str:
    return (
        f"  {what:<52} {total:7.2f} s (upload {upload:.2f} s)  ratio {total / direct:.3f} "
        f"({100 * (total / direct - 1):+.1f} %)  {check}"
    )


def bench_e2e(tmp: Path, blender: bool, povray: bool) -> list[str]:
    """Both renderers through the four services vs their own full-frame run; report lines."""
    lines: list[str] = []
    env = {
        "TESSERA_WORKER_SLOTS": str(SLOTS),
        "TESSERA_RENDERERS": "tessera,blender,povray",
        "TESSERA_ASSET_CACHE_DIR": str(tmp / "asset-cache"),
        "TESSERA_LOG_LEVEL": "WARNING",
    }
    tmp.mkdir(parents=True, exist_ok=True)
    with Stack(tmp / "stack", durable=False) as stack:
        full = stack.env() | env
        procs = ServiceProcesses(full, tmp / "logs")
        procs.start_all(workers=1)
        try:
            if blender:
                lines += _e2e_blender(tmp, full)
            if povray:
                lines += _e2e_povray(tmp, full, procs)
        finally:
            procs.stop_all()
    return lines


def _worker_with(procs: ServiceProcesses, processes: int) -> None:
    """Restart the worker with ``processes`` POV-Ray processes and as many tiles in hand."""
    procs.procs["worker-1"].stop()
    knobs = {
        "TESSERA_POVRAY_PROCESSES": str(processes),
        "TESSERA_WORKER_IN_HAND": str(processes),
        "TESSERA_LOG_LEVEL": "INFO",
    }  # fmt: skip  (wait_started reads its "started" line)
    procs.wait_started(procs.restart("worker-1", env=knobs))


def _e2e_blender(tmp: Path, env: Mapping[str, str]) -> list[str]:
    (tmp / "e2e-blend").mkdir()
    blend = build_demo_blend(tmp / "e2e-blend" / "demo.blend", W, H, SPP)
    t0 = time.perf_counter()
    whole_argv = ["blender", "-b", "-noaudio", str(blend), "--python-expr", WHOLE_SETTINGS]
    whole_argv += ["-o", str(tmp / "e2e_whole_####"), "-F", "OPEN_EXR", "-f", "1"]
    subprocess.run(whole_argv, check=True, capture_output=True)
    direct = time.perf_counter() - t0
    whole = read_exr_rgb(tmp / "e2e_whole_0001.exr")
    lines = [f"blender {W}x{H} {SPP} spp, demo scene: `blender -b -f 1` (2 threads) {direct:.2f} s"]
    for tile, per_pass in ((64, SPP), (128, SPP), (64, PASS)):
        fields = {"width": W, "height": H, "spp": SPP, "frame": 1, "tile_size": tile,
                  "options": {"samples_per_pass": per_pass}}  # fmt: skip
        upload, total, _, flt = asyncio.run(_e2e_job(env, blend, "blender", dict(fields)))
        image = np.load(io.BytesIO(flt), allow_pickle=False)
        if per_pass >= SPP:
            check = f"float image == Blender's EXR: {bool(np.array_equal(image, whole))}"
        else:
            check = f"max |diff| {np.abs(image - whole).max():.2e} (split passes)"
        what = f"Tessera, {tile}x{tile} tiles, passes of {min(per_pass, SPP)}"
        lines.append(_line(what, direct, upload, total, check))
    return lines


#: POV-Ray runs: tile edge, POV-Ray processes (None: the default, the 4 tiles in hand)
POVRAY_RUNS: tuple[tuple[int, int | None], ...] = ((128, None), (160, None), (160, 8), (240, 8))


def _e2e_povray(tmp: Path, env: Mapping[str, str], procs: ServiceProcesses) -> list[str]:
    scene_dir = tmp / "e2e-pov"
    shutil.copytree(ROOT / "tests" / "renderers" / "scenes", scene_dir)
    pov = scene_dir / "scene.pov"
    t0 = time.perf_counter()
    argv = ["povray", "-D", "+Iscene.pov", "+Owhole.png", "+FN16", f"+W{W}", f"+H{H}", "-J"]
    subprocess.run([*argv, "+WT2", *POV_AA], cwd=scene_dir, check=True, capture_output=True)
    direct = time.perf_counter() - t0
    whole = read_png((scene_dir / "whole.png").read_bytes())
    lines = [f"povray {W}x{H} +A0.1 +R3, test scene: `povray +WT2` {direct:.2f} s"]
    running: int | None = None
    for tile, processes in POVRAY_RUNS:
        if processes != running and processes is not None:
            _worker_with(procs, processes)
            running = processes
        fields = {"width": W, "height": H, "spp": 1, "tile_size": tile,
                  "options": {"options": list(POV_AA)}}  # fmt: skip
        shown = f"{processes} processes" if processes else f"{2 * SLOTS} processes (default)"
        # Twice: the first job after a worker start pays its cold start (first asset hit
        # rehashed, job and scene caches empty); the second is the steady state.
        for run in ("first", "again"):
            upload, total, png, _ = asyncio.run(_e2e_job(env, pov, "povray", dict(fields)))
            equal = bool(np.array_equal(read_png(png), whole))
            what = f"Tessera, {tile}x{tile} tiles, {shown}, {run}"
            lines.append(_line(what, direct, upload, total, f"PNG == POV-Ray's +FN16: {equal}"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blender-only", action="store_true")
    parser.add_argument("--povray-only", action="store_true")
    parser.add_argument("--standalone", action="store_true",
                        help="also the renderer-only comparison, without the services")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp:
        root = Path(tmp)
        lines = bench_e2e(root / "e2e", not args.povray_only, not args.blender_only)
        print(f"end to end through the four services, {SLOTS} cores (target <= +10 %):")
        print("\n".join(lines), flush=True)
        if args.standalone:
            if not args.povray_only:
                bench_blender(root)
            if not args.blender_only:
                bench_povray(root)


if __name__ == "__main__":
    main()
