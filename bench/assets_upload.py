"""Asset upload benchmark (not a test): a 200 MB scene through the gateway, and into a cache.

Run: ``python -m bench.assets_upload`` (``--mb N`` for another size). On the embedded stack
(NATS, PostgreSQL, the directory object store), with the gateway in this process: a POV-Ray
scene naming one texture of ``--mb`` MB of random bytes is uploaded with
:func:`services.client.assets.upload_scene` (first upload: every chunk; second: dedup, no
chunk), then materialized by a worker's :class:`~services.worker.assets.AssetCache` (download
and verification) and served again from it (a hit: stat checks only). Printed: seconds and
MB/s of each step, and the traced Python memory peak of each (tracemalloc).

Measured on the 2-core development box shared with other runs (load average ~4), 200 MB: see
the numbers in docs/architecture.md, "Assets".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats

from proto.names import Names
from services.client.api import TesseraClient
from services.client.assets import upload_scene
from services.gateway.app import Gateway
from services.worker.assets import AssetCache
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.service.runtime import Runtime

T = TypeVar("T")
MB = 1000 * 1000


async def _timed(what: str, size: int, step: Callable[[], Awaitable[T]]) -> T:
    tracemalloc.reset_peak()
    start = time.perf_counter()
    value = await step()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    rate = size / MB / seconds
    print(f"{what:<28} {seconds:7.2f} s  {rate:8.1f} MB/s  peak {peak / 2**20:6.1f} MiB")
    return value


async def _main(mb: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tessera-bench-assets-") as tmp:
        root = Path(tmp)
        scene = root / "scene"
        scene.mkdir()
        with (scene / "terrain.png").open("wb") as f:
            for _ in range(mb):
                f.write(os.urandom(MB))
        main = scene / "big.pov"
        main.write_text('height_field { png "terrain.png" }\n')
        with Stack(root / "stack", durable=False) as stack:
            env = stack.env() | {"TESSERA_NAMESPACE": "bench", "TESSERA_NODE": "bench"}
            rt = await Runtime.open(Settings.from_env(env), "gateway")
            gateway = Gateway(rt)
            await gateway.start()
            nc = await nats.connect(stack.nats.url)
            client = TesseraClient(nc, Names("bench"), timeout=30)
            tracemalloc.start()
            try:
                size = mb * MB
                asset, _ = await _timed(
                    "upload (every chunk)",
                    size,
                    lambda: upload_scene(client, main, "povray", False),
                )
                await _timed(
                    "upload again (dedup)",
                    size,
                    lambda: upload_scene(client, main, "povray", False),
                )
                cache = AssetCache(rt.store, root / "cache", 4 * size)
                await _timed("materialize (download)", size, lambda: cache.materialize(asset))
                await _timed("materialize (cache hit)", size, lambda: cache.materialize(asset))
                restarted = AssetCache(rt.store, root / "cache", 4 * size)
                await _timed("first hit after restart", size, lambda: restarted.materialize(asset))
            finally:
                tracemalloc.stop()
                await nc.close()
                await gateway.stop(5.0)
                await rt.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(prog="python -m bench.assets_upload", description=__doc__)
    parser.add_argument("--mb", type=int, default=200, help="MB of the scene's texture")
    args = parser.parse_args(argv)
    asyncio.run(_main(args.mb))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
