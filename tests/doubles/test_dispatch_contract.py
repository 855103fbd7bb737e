"""The dispatcher's release (``release_tiles``), held to the same answers on the double and on
PostgreSQL: window, priority, fair share between equal projects, oldest job first, renderer,
and jobs that are not dispatchable."""

from __future__ import annotations

from typing import Any

from shared.core.lifecycle import TileState
from shared.metadata import Job, Tile, TileCommit
from tests.doubles.conftest import Meta
from tests.metadata.conftest import RECTS, make_new_job

CAP = {"tessera": 100}


async def _job(meta: Meta, **over: Any) -> Job:
    job = (await meta.submit_job(make_new_job(**over))).job
    await meta.plan_tiles(job.job_id, RECTS)
    return job


def _ids(tiles: list[Tile]) -> list[tuple[str, int]]:
    return [(t.job_id, t.tile_index) for t in tiles]


async def test_release_stamps_the_next_generation_within_the_window(meta: Meta):
    job = await _job(meta)
    first = await meta.release_tiles({"tessera": 3}, limit=100, usage_window=300)
    assert _ids(first.tiles) == [(job.job_id, i) for i in range(3)]
    assert all(t.generation == 1 and t.published_at is not None for t in first.tiles)
    assert first.windows == {"tessera": 3}
    again = await meta.release_tiles({"tessera": 3}, limit=100, usage_window=300)
    assert again.tiles == [] and again.windows == {"tessera": 0}, "3 released, none finished"
    more = await meta.release_tiles({"tessera": 8}, limit=100, usage_window=300)
    assert _ids(more.tiles) == [(job.job_id, 3)] and more.windows == {"tessera": 5}
    assert await meta.unreleased_tiles() == 0
    tiles = await meta.list_tiles(job.job_id)
    assert [t.generation for t in tiles] == [1, 1, 1, 1]


async def test_a_finished_tile_frees_its_place_in_the_window(meta: Meta):
    job = await _job(meta)
    await meta.release_tiles({"tessera": 2}, limit=100, usage_window=300)
    assert await meta.fence_tile(job.job_id, 0, token=5, attempt_id="a", node="n")
    commit = TileCommit(job.job_id, 0, token=5, attempt_id="a", result_key="r",
                        result_sha256="ab" * 32, samples_done=16, node="n")  # fmt: skip
    await meta.commit_tile(commit)
    after = await meta.release_tiles({"tessera": 2}, limit=100, usage_window=300)
    assert _ids(after.tiles) == [(job.job_id, 2)] and after.windows == {"tessera": 1}


async def test_the_highest_priority_is_released_first(meta: Meta):
    low = await _job(meta, priority=50)
    high = await _job(meta, priority=90)
    first = await meta.release_tiles({"tessera": 6}, limit=100, usage_window=300)
    assert _ids(first.tiles) == sorted(
        [(high.job_id, i) for i in range(4)] + [(low.job_id, 0), (low.job_id, 1)]
    )
    assert await meta.unreleased_tiles() == 2


async def test_the_batch_limit_and_the_oldest_job_of_a_project_first(meta: Meta):
    older = await _job(meta)
    newer = await _job(meta)
    first = await meta.release_tiles(CAP, limit=3, usage_window=300)
    assert _ids(first.tiles) == [(older.job_id, i) for i in range(3)]
    second = await meta.release_tiles(CAP, limit=3, usage_window=300)
    assert _ids(second.tiles) == sorted([(older.job_id, 3), (newer.job_id, 0), (newer.job_id, 1)])


async def test_equal_projects_split_a_batch_evenly(meta: Meta):
    a = await _job(meta, project="alpha")
    b = await _job(meta, project="beta")
    got = await meta.release_tiles({"tessera": 4}, limit=100, usage_window=300)
    assert _ids(got.tiles) == sorted([(a.job_id, 0), (a.job_id, 1), (b.job_id, 0), (b.job_id, 1)])


async def test_only_dispatchable_jobs_of_a_renderer_with_workers(meta: Meta):
    cancelled = await _job(meta)
    await meta.request_cancel(cancelled.job_id)
    other = await _job(meta, renderer="blender")
    got = await meta.release_tiles(CAP, limit=100, usage_window=300)
    assert got.tiles == [], "a cancelled job's tiles and a renderer no worker announces"
    assert {t.state for t in await meta.list_tiles(cancelled.job_id)} == {TileState.CANCELLED}
    blender = await meta.release_tiles({"blender": 1}, limit=100, usage_window=300)
    assert _ids(blender.tiles) == [(other.job_id, 0)]
    assert await meta.release_tiles({}, limit=100, usage_window=300) == type(blender)()


async def test_tile_seconds_are_the_mean_done_attempt_of_each_renderer(meta: Meta):
    job = await _job(meta)
    other = await _job(meta, renderer="blender")
    await meta.release_tiles({"tessera": 2, "blender": 1}, limit=100, usage_window=300)
    assert await meta.tile_seconds(60) == {}, "no attempt yet"
    assert await meta.fence_tile(job.job_id, 0, token=5, attempt_id="a", node="n")
    commit = TileCommit(job.job_id, 0, token=5, attempt_id="a", result_key="r",
                        result_sha256="ab" * 32, samples_done=16, node="n")  # fmt: skip
    await meta.commit_tile(commit)
    assert await meta.fence_tile(other.job_id, 0, token=6, attempt_id="b", node="n")
    got = await meta.tile_seconds(60)
    assert list(got) == ["tessera"], "the blender attempt is still open"
    assert 0 <= got["tessera"] < 60


async def test_a_full_renderer_leaves_the_round_to_the_other(meta: Meta):
    """Waiting jobs are read for every renderer with a capacity; a full one's are dropped."""
    still = await _job(meta)
    other = await _job(meta, renderer="blender")
    first = await meta.release_tiles({"tessera": 1, "blender": 1}, limit=100, usage_window=300)
    assert _ids(first.tiles) == sorted([(still.job_id, 0), (other.job_id, 0)])
    second = await meta.release_tiles({"tessera": 1, "blender": 3}, limit=100, usage_window=300)
    assert _ids(second.tiles) == [(other.job_id, 1), (other.job_id, 2)]
    assert second.windows == {"tessera": 0, "blender": 2}
    assert second.renderers == {other.job_id: "blender"}


def _fours(renderer: str, spp: int, pixels: int) -> int:
    """Four tiles a message for a ``tessera`` job at 16 spp of 32x32 tiles, else one."""
    return 4 if (renderer, spp, pixels) == ("tessera", 16, 32 * 32) else 1


async def test_the_window_counts_messages_and_a_runs_tiles_share_one(meta: Meta):
    """The window counts messages: a window of 2 takes the four tiles of a job sent four to a
    message (one message) and one tile of a job sent one to a message; those two messages hold
    the window, so a window of 3 has room for one more."""
    runs = await _job(meta)
    alone = await _job(meta, spp=64)
    got = await meta.release_tiles({"tessera": 2}, limit=100, usage_window=300, run=_fours,
                                   most=4)  # fmt: skip
    assert _ids(got.tiles) == sorted([(runs.job_id, i) for i in range(4)] + [(alone.job_id, 0)])
    assert got.runs == {runs.job_id: 4} and got.windows == {"tessera": 2}
    again = await meta.release_tiles({"tessera": 3}, limit=100, usage_window=300, run=_fours,
                                     most=4)  # fmt: skip
    assert _ids(again.tiles) == [(alone.job_id, 1)] and again.windows == {"tessera": 1}
