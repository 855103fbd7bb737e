"""One contract for the metadata operations of the tile run and the scheduler: the in-memory
double (:mod:`tests.doubles.metadata`) and the real store on PostgreSQL, same inputs, same
answers, same rows afterwards."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from shared.core.errors import ConflictError, NotFoundError, ValidationError
from shared.core.lifecycle import IllegalTransition, JobState, JobTrigger, TileState, TileTrigger
from shared.metadata import AttemptOutcome, CommitOutcome, Job, Tile, TileCommit
from shared.metadata.fastpath import ANY_GENERATION
from shared.metadata.tiles import EdgeChosen
from tests.doubles.conftest import Meta
from tests.doubles.metadata import MemoryMetadata
from tests.metadata.conftest import RECTS, make_new_job


async def _planned(meta: Meta) -> Job:
    job = (await meta.submit_job(make_new_job())).job
    await meta.plan_tiles(job.job_id, RECTS, node="n")
    got = await meta.get_job(job.job_id)
    assert got is not None
    return got


async def _tile(meta: Meta, job_id: str, i: int = 0) -> Tile:
    tile = await meta.get_tile(job_id, i)
    assert tile is not None
    return tile


async def _state(meta: Meta, job_id: str) -> JobState:
    job = await meta.get_job(job_id)
    assert job is not None
    return job.state


async def _outcomes(meta: Meta, job_id: str) -> dict[str, AttemptOutcome | None]:
    return {a.attempt_id: a.outcome for a in await meta.attempts(job_id)}


def _commit(job_id: str, token: int, attempt: str, i: int = 0) -> TileCommit:
    return TileCommit(job_id, i, token=token, attempt_id=attempt, result_key=f"r/{attempt}",
                      result_sha256="ab" * 32, samples_done=16, node="n")  # fmt: skip


async def _fence(meta: Meta, job_id: str, token: int, attempt: str, i: int = 0) -> bool:
    """As a worker fences: the one statement, then the transaction where it declined."""
    first = await meta.fence_first(job_id, i, token=token, attempt_id=attempt, node="n",
                                   generation=ANY_GENERATION)  # fmt: skip
    if first.fenced:
        return True
    return await meta.fence_tile(job_id, i, token=token, attempt_id=attempt, node="n")


async def test_plan_is_idempotent_and_refuses_another_plan(meta: Meta):
    job = (await meta.submit_job(make_new_job())).job
    assert job.state is JobState.QUEUED and await meta.get_job("nope") is None
    first = await meta.plan_tiles(job.job_id, RECTS)
    again = await meta.plan_tiles(job.job_id, RECTS)
    assert [t.rect for t in first] == [t.rect for t in again] == [tuple(r) for r in RECTS]
    assert all(t.state is TileState.QUEUED and t.lease_fence == 0 for t in again)
    planned = await meta.get_job(job.job_id)
    assert planned is not None and planned.tiles_total == 4 and planned.state is JobState.RUNNING
    with pytest.raises(ConflictError):
        await meta.plan_tiles(job.job_id, RECTS[:2])
    with pytest.raises(ConflictError):
        await meta.plan_tiles(job.job_id, [(0, 0, 1, 1), *RECTS[1:]])
    with pytest.raises(ValidationError):
        await meta.plan_tiles(job.job_id, [])
    with pytest.raises(NotFoundError):
        await meta.plan_tiles("nope", RECTS)


async def test_a_cancelled_job_is_not_planned_and_cancels_its_idle_tiles(meta: Meta):
    unplanned = (await meta.submit_job(make_new_job())).job
    await meta.request_cancel(unplanned.job_id)
    with pytest.raises(IllegalTransition):
        await meta.plan_tiles(unplanned.job_id, RECTS)
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 7, "a")
    cancelled = await meta.request_cancel(job.job_id)
    assert cancelled.state is JobState.CANCELLED and cancelled.cancel_requested
    assert await meta.is_cancel_requested(job.job_id)
    states = [t.state for t in await meta.list_tiles(job.job_id)]
    assert states == [TileState.LEASED] + [TileState.CANCELLED] * 3, "its owner stops a leased one"
    assert not await _fence(meta, job.job_id, 9, "b", 0), "no new owner for a cancelled job"
    with pytest.raises(IllegalTransition):
        await meta.request_cancel(job.job_id)
    with pytest.raises(NotFoundError):
        await meta.is_cancel_requested("nope")


async def test_mark_published_never_moves_the_generation_back(meta: Meta):
    job = await _planned(meta)
    await meta.mark_published(job.job_id, [0, 1], 2)
    await meta.mark_published(job.job_id, [0], 1)
    tiles = await meta.list_tiles(job.job_id)
    assert [t.generation for t in tiles] == [2, 2, 0, 0]
    assert [t.published_at is not None for t in tiles] == [True, True, False, False]


async def test_the_fence_takes_only_a_larger_token(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "a")
    tile = await _tile(meta, job.job_id)
    assert (tile.state, tile.lease_fence, tile.attempt_count) == (TileState.LEASED, 5, 1)
    assert await _state(meta, job.job_id) is JobState.PROGRESSING
    assert not await _fence(meta, job.job_id, 5, "b"), "an equal token is not newer"
    assert not await _fence(meta, job.job_id, 4, "c"), "nor a smaller one"
    assert await _fence(meta, job.job_id, 6, "d"), "a takeover by a newer owner"
    tile = await _tile(meta, job.job_id)
    assert (tile.state, tile.lease_fence, tile.attempt_count) == (TileState.LEASED, 6, 2)
    assert await _outcomes(meta, job.job_id) == {"a": None, "d": None}, "refusals record none"
    with pytest.raises(NotFoundError):
        await _fence(meta, job.job_id, 9, "e", 99)


async def test_progress_is_fenced(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "a")
    assert await _fence(meta, job.job_id, 6, "b")
    assert not await meta.record_progress(job.job_id, 0, token=5, samples_done=4)
    assert await meta.record_progress(job.job_id, 0, token=6, samples_done=8)
    tile = await _tile(meta, job.job_id)
    assert (tile.state, tile.samples_done) == (TileState.PROGRESSING, 8)
    assert not await meta.record_progress(job.job_id, 1, token=6, samples_done=8), "not leased"


async def test_commit_refusals_tell_fenced_from_already_done(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "old")
    assert await _fence(meta, job.job_id, 6, "new")
    assert await meta.commit_tile(_commit(job.job_id, 5, "old")) is CommitOutcome.FENCED
    assert (await _tile(meta, job.job_id)).state is TileState.LEASED
    assert await meta.commit_tile(_commit(job.job_id, 6, "new")) is CommitOutcome.COMMITTED
    tile = await _tile(meta, job.job_id)
    assert (tile.state, tile.result_key, tile.samples_done) == (TileState.DONE, "r/new", 16)
    again = await meta.commit_tile(_commit(job.job_id, 6, "new"))
    assert again is CommitOutcome.ALREADY_DONE
    assert await _outcomes(meta, job.job_id) == {
        "old": AttemptOutcome.FENCED,
        "new": AttemptOutcome.DONE,  # the first outcome wins: the repeat's "fenced" is ignored
    }
    assert not await _fence(meta, job.job_id, 7, "late"), "a done tile is never fenced again"


async def test_fence_first_fences_only_the_plain_case_and_returns_the_row_before(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 1, "starter", 1), "the job's first tile: the transaction"
    assert await _state(meta, job.job_id) is JobState.PROGRESSING
    before = await _tile(meta, job.job_id)
    first = await meta.fence_first(job.job_id, 0, token=5, attempt_id="a", node="n",
                                   generation=before.generation)  # fmt: skip
    assert first.fenced and first.tile == before, "the row as it was, fenced"
    after = await _tile(meta, job.job_id)
    assert (after.state, after.lease_fence, after.attempt_count) == (TileState.LEASED, 5, 1)
    assert await _outcomes(meta, job.job_id) == {"starter": None, "a": None}
    again = await meta.fence_first(job.job_id, 0, token=9, attempt_id="b", node="n",
                                   generation=after.generation)  # fmt: skip
    assert not again.fenced and again.tile == after, "leased before: declined, row returned"
    assert await _tile(meta, job.job_id) == after, "a decline writes nothing"
    done = await meta.commit_tile(_commit(job.job_id, 5, "a"))
    assert done is CommitOutcome.COMMITTED
    done_row = await _tile(meta, job.job_id)
    late = await meta.fence_first(job.job_id, 0, token=9, attempt_id="c", node="n",
                                  generation=ANY_GENERATION)  # fmt: skip
    assert not late.fenced and late.tile == done_row and done_row.state is TileState.DONE
    await meta.release_tiles({"tessera": 8}, limit=100, usage_window=300)
    fresh = await _tile(meta, job.job_id, 2)
    assert fresh.generation == 1, "released once"
    old = await meta.fence_first(job.job_id, 2, token=9, attempt_id="d", node="n",
                                 generation=fresh.generation - 1)  # fmt: skip
    assert not old.fenced and old.tile == fresh, "a superseded message never fences"
    missing = await meta.fence_first(job.job_id, 99, token=9, attempt_id="e", node="n",
                                     generation=0)  # fmt: skip
    assert missing.tile is None and not missing.fenced
    await meta.request_cancel(job.job_id)
    plain = await _tile(meta, job.job_id, 3)
    stopped = await meta.fence_first(job.job_id, 3, token=9, attempt_id="f", node="n",
                                     generation=plain.generation)  # fmt: skip
    assert not stopped.fenced and stopped.tile == plain, "a cancel-requested job: declined"


async def test_completed_by_names_the_newest_fence_once_every_tile_is_done(meta: Meta):
    job = (await meta.submit_job(make_new_job())).job
    assert await meta.completed_by(job.job_id) is None, "an unplanned job is not complete"
    await meta.plan_tiles(job.job_id, RECTS, node="n")
    tokens = [7, 3] + [10 + i for i in range(len(RECTS) - 2)]  # committed out of fence order
    for i, token in enumerate(tokens):
        assert await meta.completed_by(job.job_id) is None
        assert await _fence(meta, job.job_id, token, f"a{i}", i)
        assert await meta.commit_tile(_commit(job.job_id, token, f"a{i}", i)) is (
            CommitOutcome.COMMITTED
        )
    assert await meta.completed_by(job.job_id) == max(tokens)
    with pytest.raises(NotFoundError):
        await meta.completed_by("nope")


async def test_a_commit_stands_when_the_job_went_terminal_meanwhile(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "a")
    await meta.request_cancel(job.job_id)
    assert await meta.commit_tile(_commit(job.job_id, 5, "a")) is CommitOutcome.COMMITTED
    assert await _state(meta, job.job_id) is JobState.CANCELLED


async def test_a_commit_of_a_tile_no_longer_working_is_fenced(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "a")
    await meta.fail_tile(job.job_id, 0, token=5, attempt_id="a", trigger=TileTrigger.LEASE_LOST,
                         error_code="x", error="x", node="n", outcome="lease_lost")  # fmt: skip
    assert await meta.commit_tile(_commit(job.job_id, 5, "a")) is CommitOutcome.FENCED
    assert (await _tile(meta, job.job_id)).state is TileState.QUEUED
    assert await _outcomes(meta, job.job_id) == {"a": AttemptOutcome.LEASE_LOST}


async def test_fail_tile_is_fenced_and_moves_by_the_machine(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "old")
    assert await _fence(meta, job.job_id, 6, "new")
    stale = await meta.fail_tile(
        job.job_id, 0, token=5, attempt_id="old", trigger=TileTrigger.RETRYABLE_FAILURE,
        error_code="e", error="boom", node="n", outcome="retryable",
    )  # fmt: skip
    assert stale is None and (await _tile(meta, job.job_id)).state is TileState.LEASED
    moved = await meta.fail_tile(
        job.job_id, 0, token=6, attempt_id="new", trigger=TileTrigger.RETRYABLE_FAILURE,
        error_code="e", error="boom", node="n", outcome="retryable",
    )  # fmt: skip
    assert moved is not None and moved.state is TileState.FAILED_RETRYABLE
    assert (moved.last_error_code, moved.last_error) == ("e", "boom")
    assert await _outcomes(meta, job.job_id) == {
        "old": AttemptOutcome.FENCED,
        "new": AttemptOutcome.RETRYABLE,
    }
    with pytest.raises(IllegalTransition):  # a retryable failure of a tile not working
        await meta.fail_tile(
            job.job_id, 0, token=6, attempt_id="new", trigger=TileTrigger.RETRYABLE_FAILURE,
            error_code="e", error="boom", node="n", outcome="retryable",
        )  # fmt: skip
    with pytest.raises(ValidationError):
        await meta.fail_tile(
            job.job_id, 0, token=6, attempt_id="new", trigger=TileTrigger.CANCEL,
            error_code="e", error="boom", node="n", outcome="bogus",
        )  # fmt: skip
    dead = await meta.fail_tile(
        job.job_id, 1, token=None, attempt_id=None, trigger=TileTrigger.DEAD_LETTER,
        error_code="max_deliveries", error="gone", node="n", outcome=AttemptOutcome.TERMINAL,
        job_trigger=JobTrigger.DEAD_LETTER,
    )  # fmt: skip
    assert dead is not None and dead.state is TileState.DEAD_LETTERED
    failed = await meta.get_job(job.job_id)
    assert failed is not None and failed.state is JobState.DEAD_LETTERED
    assert (failed.last_error_code, failed.finished_at is not None) == ("max_deliveries", True)


async def test_end_attempt_first_outcome_wins(meta: Meta):
    job = await _planned(meta)
    assert await _fence(meta, job.job_id, 5, "a")
    await meta.end_attempt("a", outcome="handed_back")
    await meta.end_attempt("a", outcome=AttemptOutcome.FENCED, error_code="fenced")
    await meta.end_attempt(uuid.uuid4().hex, outcome="fenced")  # unknown: nothing to close
    (attempt,) = await meta.attempts(job.job_id)
    assert (attempt.outcome, attempt.error_code) == (AttemptOutcome.HANDED_BACK, None)
    assert attempt.ended_at is not None and (attempt.fence, attempt.node) == (5, "n")
    with pytest.raises(ValidationError):
        await meta.end_attempt("a", outcome="bogus")


async def test_transition_job_by_the_machine(meta: Meta):
    job = await _planned(meta)
    with pytest.raises(IllegalTransition):
        await meta.transition_job(job.job_id, JobTrigger.FINALIZED)
    with pytest.raises(IllegalTransition):
        await meta.transition_job(job.job_id, JobTrigger.CANCEL, expected=JobState.QUEUED)
    same = await meta.transition_job(job.job_id, JobTrigger.TILES_PLANNED)
    assert same.state is JobState.RUNNING and same.finished_at is None
    failed = await meta.transition_job(
        job.job_id, JobTrigger.TERMINAL_FAILURE, node="n", error_code="kernel", error="bad"
    )
    assert failed.state is JobState.FAILED_TERMINAL and failed.finished_at is not None
    assert (failed.last_error_code, failed.last_error) == ("kernel", "bad")
    with pytest.raises(IllegalTransition):
        await meta.transition_job(job.job_id, JobTrigger.TERMINAL_FAILURE)
    with pytest.raises(NotFoundError):
        await meta.transition_job("nope", JobTrigger.CANCEL)


async def test_submit_is_idempotent_per_key(meta: Meta):
    new = make_new_job(key="k1")
    first = await meta.submit_job(new)
    again = await meta.submit_job(dataclasses.replace(new, job_id="other"))
    assert first.created and not again.created and again.job.job_id == first.job.job_id
    assert (first.job.state, first.job.generation, first.job.tiles_total) == (JobState.QUEUED, 0, 0)
    with pytest.raises(ConflictError):
        await meta.submit_job(make_new_job(key="k1", body={"spp": 1}))


async def test_an_auto_job_takes_the_first_planned_edge_and_refuses_another(meta: Meta):
    job = (await meta.submit_job(make_new_job(tile_size=0, tile_auto=True))).job
    assert (job.tile_size, job.tile_auto) == (0, True)
    tiles = await meta.plan_tiles(job.job_id, RECTS, tile_size=32)
    assert len(tiles) == 4
    planned = await meta.get_job(job.job_id)
    assert planned is not None and (planned.tile_size, planned.tiles_total) == (32, 4)
    assert [t.rect for t in await meta.plan_tiles(job.job_id, RECTS, tile_size=32)] == [
        t.rect for t in tiles
    ], "planning again with the chosen edge changes nothing"
    with pytest.raises(EdgeChosen):  # another planner's edge: plan again (it reads 32)
        await meta.plan_tiles(job.job_id, [(0, 0, 64, 48)], tile_size=64)
    again = await meta.get_job(job.job_id)
    assert again is not None and again.tile_size == 32


async def _attempts_took(meta: Meta, job_id: str, seconds: float) -> None:
    """The history a real render leaves: the job's attempts each ``seconds`` long (test set-up:
    the store has no verb that rewrites attempt times)."""
    if isinstance(meta, MemoryMetadata):
        for key, a in list(meta.attempt_rows.items()):
            if a.job_id == job_id and a.ended_at is not None:
                started = a.ended_at - timedelta(seconds=seconds)
                meta.attempt_rows[key] = dataclasses.replace(a, started_at=started)
        return
    async with meta._pool.acquire() as conn:
        await conn.execute(
            "UPDATE attempts SET started_at = ended_at - make_interval(secs => $2) "
            "WHERE job_id = $1",
            job_id,
            seconds,
        )


async def test_tile_cost_is_measured_on_finished_tiles_of_the_scene_then_of_the_renderer(
    meta: Meta,
):
    measured = (await meta.submit_job(make_new_job(cost_key="scene-a"))).job
    await meta.plan_tiles(measured.job_id, RECTS)
    assert await meta.tile_cost("other", "scene-a", "tessera") is None, "nothing finished yet"

    async def commit(i: int) -> None:
        assert await _fence(meta, measured.job_id, i + 1, f"a{i}", i)
        done = dataclasses.replace(_commit(measured.job_id, i + 1, f"a{i}", i), samples_done=16)
        assert await meta.commit_tile(done) is CommitOutcome.COMMITTED

    for i in range(3):
        await commit(i)
    assert await meta.tile_cost("other", "scene-a", "tessera") is None, (
        "attempts of a few ms are the fixed cost of a tile, not its samples"
    )
    await _attempts_took(meta, measured.job_id, 0.5)
    assert await meta.tile_cost("other", "scene-a", "tessera") is None, "three say too little"
    await commit(3)
    await _attempts_took(meta, measured.job_id, 0.5)
    scene = await meta.tile_cost("other", "scene-a", "tessera")
    assert scene is not None and (scene.scope, scene.attempts) == ("scene", 4)
    # two 32x32 tiles and two 32x16 ones, 16 samples each, 0.5 s apiece: the middle two
    assert scene.seconds_per_sample == pytest.approx(
        (0.5 / (32 * 32 * 16) + 0.5 / (32 * 16 * 16)) / 2
    )
    renderer = await meta.tile_cost("other", "scene-b", "tessera")
    assert renderer is not None and (renderer.scope, renderer.attempts) == ("renderer", 4)
    assert renderer.seconds_per_sample == pytest.approx(scene.seconds_per_sample)
    assert await meta.tile_cost("other", "scene-c", "povray") is None, (
        "another renderer's tiles say nothing"
    )
    mine = await meta.tile_cost(measured.job_id, "scene-a", "tessera")
    assert mine is None, "a job's own tiles are left out (it is the one being planned)"
