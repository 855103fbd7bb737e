"""``tile_size: "auto"`` planned for real: the scheduler's planner on PostgreSQL and the live
workers' bucket picks the edge from the measured cost, every live thread gets a tile, and a
redelivered plan keeps the edge it chose."""

from __future__ import annotations

from typing import Any

import asyncpg

from proto.limits import auto_tile_edge, tile_count
from proto.messages import JobMessage
from services.scheduler.planner import Planner
from shared.metadata import Job, TileCommit
from shared.service.runtime import Runtime
from tests.e2e.flows import announce_idle_worker
from tests.metadata.conftest import make_new_job

SIDE, SPP = 512, 64


async def _auto_job(rt: Runtime, key: str = "scene-k", **over: Any) -> Job:
    new = make_new_job(width=SIDE, height=SIDE, spp=SPP, tile_size=0, tile_auto=True,
                       cost_key=key, **over)  # fmt: skip
    return (await rt.db.submit_job(new)).job


async def _planned(rt: Runtime, job: Job) -> Job:
    await Planner(rt).plan(JobMessage(job.job_id, job.generation))
    got = await rt.db.get_job(job.job_id)
    assert got is not None and got.tiles_total == len(await rt.db.list_tiles(job.job_id))
    return got


async def _render_all(
    rt: Runtime, job: Job, database_url: str, seconds: float, render_seconds: float | None = None
) -> None:
    """Commit every tile of ``job`` (planned), each attempt recorded as ``seconds`` long, its
    passes as ``render_seconds``."""
    for tile in await rt.db.list_tiles(job.job_id):
        attempt = f"a-{job.job_id[-6:]}-{tile.tile_index}"
        assert await rt.db.fence_tile(job.job_id, tile.tile_index, token=1, attempt_id=attempt,
                                      node="n")  # fmt: skip
        await rt.db.commit_tile(TileCommit(job.job_id, tile.tile_index, token=1,
                                           attempt_id=attempt, result_key=f"r/{attempt}",
                                           result_sha256="ab" * 32, samples_done=SPP,
                                           node="n", render_seconds=render_seconds))  # fmt: skip
    await _attempts_took(database_url, job, seconds)


async def _attempts_took(database_url: str, job: Job, seconds: float) -> None:
    conn = await asyncpg.connect(database_url)
    try:  # the history a real render would have left: attempts of known length
        await conn.execute(
            "UPDATE attempts SET started_at = ended_at - make_interval(secs => $2) "
            "WHERE job_id = $1",
            job.job_id,
            seconds,
        )
    finally:
        await conn.close()


async def test_unmeasured_auto_jobs_take_the_default_cost_and_every_thread_gets_a_tile(
    runtime: Runtime,
) -> None:
    config = runtime.settings.scheduler
    alone = await _planned(runtime, await _auto_job(runtime))
    expected = auto_tile_edge(SIDE, SIDE, SPP, seconds_per_sample=config.tile_cost,
                              target_seconds=config.tile_seconds, threads=1)  # fmt: skip
    assert alone.tile_size == expected == 176 and alone.tiles_total == 9
    await announce_idle_worker(runtime.js, runtime.names, threads=16)
    farm = await _planned(runtime, await _auto_job(runtime))
    assert farm.tile_size == 128 and farm.tiles_total == 16, "16 live threads: 16 tiles"
    explicit = (await runtime.db.submit_job(make_new_job(width=SIDE, height=SIDE, spp=SPP,
                                                         tile_size=64))).job  # fmt: skip
    assert (await _planned(runtime, explicit)).tile_size == 64, "an explicit edge wins"


async def test_the_measured_cost_of_the_scene_sizes_the_next_job_and_a_replan_keeps_its_edge(
    runtime: Runtime, database_url: str
) -> None:
    new = make_new_job(width=SIDE, height=SIDE, spp=SPP, tile_size=64, cost_key="scene-k")
    first = (await runtime.db.submit_job(new)).job
    first = await _planned(runtime, first)
    # 4e-6 s per pixel-sample: a 64x64 tile of 64 spp took 1.048576 s
    await _render_all(runtime, first, database_url, 4e-6 * 64 * 64 * SPP)
    measured = await runtime.db.tile_cost("someone-else", "scene-k", "tessera")
    assert measured is not None and measured.attempts == 64
    assert abs(measured.seconds_per_sample - 4e-6) < 1e-12
    job = await _planned(runtime, await _auto_job(runtime))
    assert job.tile_size == 88, "2 s at 4e-6 s per pixel-sample and 64 spp: 88 px"
    assert job.tiles_total == 36
    # the scene got cheaper since; a redelivered JOBS message plans the same edge and tiles
    await _attempts_took(database_url, first, 5e-7 * 64 * 64 * SPP)
    tiles = await runtime.db.list_tiles(job.job_id)
    again = await _planned(runtime, job)
    assert again.tile_size == 88 and await runtime.db.list_tiles(job.job_id) == tiles
    # another scene of the same renderer: the renderer's measurement (now the cheaper one)
    other = await _planned(runtime, await _auto_job(runtime, key="scene-new"))
    assert other.tile_size == 176 and tile_count(SIDE, SIDE, other.tile_size) == 9
    # attempts too short to tell samples from the fixed cost of a tile are not measured
    await _attempts_took(database_url, first, 0.05)
    assert await runtime.db.tile_cost("someone-else", "scene-k", "tessera") is None


async def test_the_cost_is_what_the_passes_took_not_the_attempts_time_from_fence_to_commit(
    runtime: Runtime, database_url: str
) -> None:
    # A worker holds twice as many tiles as threads and their passes share the threads: each
    # attempt lasted twice what its passes took. The cost is the passes' time.
    new = make_new_job(width=SIDE, height=SIDE, spp=SPP, tile_size=64, cost_key="scene-r")
    first = await _planned(runtime, (await runtime.db.submit_job(new)).job)
    took = 1e-6 * 64 * 64 * SPP
    await _render_all(runtime, first, database_url, 2 * took, render_seconds=took)
    assert {a.render_seconds for a in await runtime.db.attempts(first.job_id)} == {took}
    measured = await runtime.db.tile_cost("someone-else", "scene-r", "tessera")
    assert measured is not None and measured.attempts == 64
    assert abs(measured.seconds_per_sample - 1e-6) < 1e-12
    job = await _planned(runtime, await _auto_job(runtime, key="scene-r"))
    assert job.tile_size == auto_tile_edge(SIDE, SIDE, SPP, seconds_per_sample=1e-6,
                                           target_seconds=runtime.settings.scheduler.tile_seconds,
                                           threads=1)  # fmt: skip
    # passes too short to tell samples from a tile's fixed cost are not measured, however long
    # the attempt was
    short = make_new_job(width=SIDE, height=SIDE, spp=SPP, tile_size=64, cost_key="scene-s")
    brief = await _planned(runtime, (await runtime.db.submit_job(short)).job)
    await _render_all(runtime, brief, database_url, 5.0, render_seconds=0.05)
    assert await runtime.db.tile_cost("someone-else", "scene-s", "renderer-none") is None
