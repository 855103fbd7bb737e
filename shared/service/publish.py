"""Publishing tiles to ``TILES``: the dispatcher's release (:func:`publish_released`, rows
already stamped in the release's transaction), the sweeper's re-publish of lost tiles and a DLQ
requeue (:func:`publish_tiles`, which stamps ``published_at`` around the publishes)."""

from __future__ import annotations

import asyncio

from proto import names as n
from proto.messages import TileMessage
from shared.core import crash
from shared.metadata import Tile
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime

__all__ = ["publish_released", "publish_tiles"]

_PUBLISH_CONCURRENCY = 256


async def publish_tiles(rt: Runtime, tiles: list[Tile]) -> None:
    """Publish the TILES messages of ``tiles``, each under its row's generation, concurrently.

    ``published_at`` is stamped before the publishes and again after them: the first stamp
    tells the sweeper these tiles are being published (its claim of a tile whose
    ``published_at`` moved fails), the second starts the sweep age at the actual publish.
    """
    by_generation: dict[tuple[str, int], list[int]] = {}
    for t in tiles:
        by_generation.setdefault((t.job_id, t.generation), []).append(t.tile_index)

    async def stamp() -> None:
        for (job_id, gen), indexes in by_generation.items():
            await rt.db.mark_published(job_id, indexes, gen)

    await stamp()
    await _publish(rt, tiles)
    await stamp()


async def publish_released(rt: Runtime, tiles: list[Tile]) -> None:
    """Publish the TILES messages of tiles the dispatcher just released (their rows carry the
    new generation and ``published_at`` already), concurrently; the crash point
    ``scheduler.mid_publish`` sits after the first half."""
    half = len(tiles) // 2
    await _publish(rt, tiles[:half])
    crash.crash_point("scheduler.mid_publish")
    await _publish(rt, tiles[half:])


async def _publish(rt: Runtime, tiles: list[Tile]) -> None:
    """Each tile's message under ``tile:<job>:<i>:<gen>``, at most 256 in flight."""
    gate = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
    names = rt.names

    async def one(tile: Tile) -> None:
        gen = tile.generation
        message = TileMessage(tile.job_id, tile.tile_index, gen)
        async with gate:
            ack = await publish(
                rt.js,
                names.tile_subject(tile.job_id, tile.tile_index),
                message,
                msg_id=n.tile_msg_id(tile.job_id, tile.tile_index, gen),
            )
        rt.metrics.published(ack)

    await asyncio.gather(*(one(t) for t in tiles))
