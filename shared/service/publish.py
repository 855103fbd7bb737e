"""Publishing a job's tiles to ``TILES``: the planner's first publish, the sweeper's re-publish of
lost tiles and a DLQ requeue all go through :func:`publish_tiles`."""

from __future__ import annotations

import asyncio

from proto import names as n
from proto.messages import TileMessage
from shared.metadata import Tile
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime

__all__ = ["publish_tiles"]

_PUBLISH_CONCURRENCY = 256


async def publish_tiles(rt: Runtime, tiles: list[Tile]) -> None:
    """Publish the TILES messages of ``tiles``, each under its row's generation, concurrently.

    ``published_at`` is stamped before the publishes and again after them: the first stamp
    tells the sweeper these tiles are being published (its claim of a tile whose
    ``published_at`` moved fails), the second starts the sweep age at the actual publish.
    """
    gate = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
    names = rt.names
    by_generation: dict[tuple[str, int], list[int]] = {}
    for t in tiles:
        by_generation.setdefault((t.job_id, t.generation), []).append(t.tile_index)

    async def stamp() -> None:
        for (job_id, gen), indexes in by_generation.items():
            await rt.db.mark_published(job_id, indexes, gen)

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

    await stamp()
    await asyncio.gather(*(one(t) for t in tiles))
    await stamp()
