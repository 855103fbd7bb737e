"""A worker process with an asset cache: ``python -m tests.renderers.asset_worker``.

``services.worker.__main__`` builds ``Worker(rt)`` without an
:class:`~services.worker.assets.AssetCache` on this branch (the wiring of issue 17 adds it
there); this entry builds the worker exactly as that wiring does (``Worker(rt, assets=cache)``),
so the full-stack renderer tests run real workers on Blender and POV-Ray jobs. Once the worker's
own entry point has the cache, :func:`tests.renderers.stack.start_worker` can start it instead.
"""

from __future__ import annotations

import asyncio
import sys

from services.worker.assets import AssetCache
from services.worker.loop import Worker
from shared.service.runtime import Runtime, service_main


async def run(rt: Runtime, stop: asyncio.Event) -> None:
    """Render tiles until ``stop``, scene assets from ``rt``'s object store."""
    sys.setswitchinterval(0.0005)
    cache = AssetCache.of(rt.store, rt.settings, log=rt.log)
    try:
        await Worker(rt, assets=cache).run(stop)
    finally:
        await cache.close()


def main() -> int:
    """Run until SIGTERM, like ``python -m services.worker``."""
    return service_main("worker", run)


if __name__ == "__main__":
    sys.exit(main())
