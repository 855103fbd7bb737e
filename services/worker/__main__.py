"""``tessera worker`` / ``python -m services.worker``: wiring only."""

from __future__ import annotations

import asyncio
import sys

from services.worker.assets import AssetCache
from services.worker.loop import Worker
from shared.service.runtime import Runtime, service_main


async def run(rt: Runtime, stop: asyncio.Event) -> None:
    """Render tiles until ``stop``."""
    # Kernel threads re-take the GIL after every pass; a short switch interval keeps them from
    # waiting up to 5 ms behind the event loop (measured: about 1 % of a full-frame job).
    sys.setswitchinterval(0.0005)
    # Scene assets of Blender and POV-Ray jobs, on local disk (TESSERA_ASSET_CACHE_DIR/_BYTES).
    assets = AssetCache.of(rt.store, rt.settings, log=rt.log.bind(component="assets"))
    await assets.open()
    try:
        await Worker(rt, assets=assets).run(stop)
    finally:
        await assets.close()


def main() -> int:
    """Run a worker until SIGTERM (in-flight tiles are handed back within the grace period)."""
    return service_main("worker", run)


if __name__ == "__main__":
    sys.exit(main())
