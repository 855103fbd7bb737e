"""A stand-in worker for the no-orphan tests: renders through a renderer until it is killed.

``python -m tests.renderers.worker_standin blender FILE`` renders a small warm-up tile, prints
``blender-pid <pid>``, then a long pass (``TESSERA_CRASH_AT=worker.blender_mid_pass:2`` makes it
SIGKILL itself inside that pass). ``... povray FILE`` starts a tile and prints
``povray-pid <pid>`` for each POV-Ray process it runs, then waits to be killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from kernel.rect import Rect
from services.worker.renderers.blender import BlenderRenderer, BlenderScene
from services.worker.renderers.povray import PovrayRenderer, PovrayScene
from shared.core import crash
from shared.core.tiles import zeros_for


async def blender(path: Path) -> None:
    renderer = BlenderRenderer(slots=1, watchdog=300.0)
    rect = Rect(0, 0, 8, 8)
    await renderer.render(BlenderScene(path, 1, 64, 48, 2), rect, 0, 2, zeros_for(rect))
    print(f"blender-pid {renderer.slots[0].pid}", flush=True)
    long = BlenderScene(path, 1, 64, 48, 1_000_000)
    await renderer.render(long, rect, 0, 1_000_000, zeros_for(rect))


async def povray(path: Path) -> None:
    renderer = PovrayRenderer(slots=1, watchdog=300.0)
    rect = Rect(0, 0, 16, 16)
    task = asyncio.create_task(
        renderer.render(PovrayScene(path, 64, 48, 1), rect, 0, 1, zeros_for(rect))
    )
    while not renderer._running:  # noqa: ASYNC110 - the render task fills it; no event
        await asyncio.sleep(0.01)
    for proc in renderer._running:
        print(f"povray-pid {proc.pid}", flush=True)
    await task


def main() -> None:
    crash.arm(os.environ)
    kind, path = sys.argv[1], Path(sys.argv[2])
    asyncio.run(blender(path) if kind == "blender" else povray(path))


if __name__ == "__main__":
    main()
