"""Publishing tiles to ``TILES``: the dispatcher's release (:func:`publish_released`, rows
already stamped in the release's transaction), the sweeper's re-publish of lost tiles and a DLQ
requeue (:func:`publish_tiles`, which stamps ``published_at`` around the publishes)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from proto import names as n
from proto.messages import TileMessage
from shared.core import crash
from shared.core.runs import runs
from shared.metadata import Tile
from shared.nats.jetstream import publish
from shared.service.runtime import Runtime

__all__ = ["publish_released", "publish_tiles"]

_PUBLISH_CONCURRENCY = 256


async def publish_tiles(
    rt: Runtime, tiles: list[Tile], renderers: Mapping[str, str] | None = None
) -> None:
    """Publish the TILES messages of ``tiles``, each under its row's generation, concurrently.

    Each goes to its job's renderer's subject (``tessera.tiles.<renderer>.<job>.<i>``):
    ``renderers`` maps job ids to renderers; a job it does not name is looked up.

    ``published_at`` is stamped before the publishes and again after them: the first stamp
    tells the sweeper these tiles are being published (its claim of a tile whose
    ``published_at`` moved fails), the second starts the sweep age at the actual publish.
    """
    by_generation: dict[tuple[str, int], list[int]] = {}
    for t in tiles:
        by_generation.setdefault((t.job_id, t.generation), []).append(t.tile_index)

    renderer_of = dict(renderers or {})
    for job_id in {t.job_id for t in tiles} - renderer_of.keys():
        job = await rt.db.get_job(job_id)
        renderer_of[job_id] = n.RENDERER_TESSERA if job is None else job.renderer

    async def stamp() -> None:
        for (job_id, gen), indexes in by_generation.items():
            await rt.db.mark_published(job_id, indexes, gen)

    await stamp()
    await _publish(rt, [[t] for t in tiles], renderer_of)
    await stamp()


async def publish_released(
    rt: Runtime,
    tiles: list[Tile],
    renderers: Mapping[str, str],
    run_length: Mapping[str, int] | None = None,
) -> None:
    """Publish the TILES messages of tiles the dispatcher just released (their rows carry the
    new generation and ``published_at`` already; ``renderers`` maps their jobs to renderers),
    concurrently; the crash point ``scheduler.mid_publish`` sits after the first half.

    ``run_length`` maps a job to the most tiles one of its messages carries (a run of
    consecutive tiles under one generation, :func:`shared.core.runs.runs`); a job it does not
    name sends one message per tile.
    """
    grouped = runs(tiles, run_length or {})
    half = len(grouped) // 2
    await _publish(rt, grouped[:half], renderers)
    crash.crash_point("scheduler.mid_publish")
    await _publish(rt, grouped[half:], renderers)


async def _publish(
    rt: Runtime, grouped: Sequence[Sequence[Tile]], renderer_of: Mapping[str, str]
) -> None:
    """Each run's message under ``tile:<job>:<i>:<gen>[:<run>]`` on its renderer's subject
    (``...<job>.<i>``, a run's ``...<job>.<first>-<last>``), at most 256 in flight."""
    gate = asyncio.Semaphore(_PUBLISH_CONCURRENCY)
    names = rt.names

    async def one(run: Sequence[Tile]) -> None:
        first = run[0]
        job_id, index, gen = first.job_id, first.tile_index, first.generation
        message = TileMessage(job_id, index, gen, len(run))
        async with gate:
            ack = await publish(
                rt.js,
                names.tile_subject(job_id, index, renderer_of[job_id], len(run)),
                message,
                msg_id=n.tile_msg_id(job_id, index, gen, len(run)),
            )
        rt.metrics.published(ack)

    await asyncio.gather(*(one(run) for run in grouped))
