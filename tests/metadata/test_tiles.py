"""Tiles: plan, lease fence, fenced progress/commit/failure, sweeper and progress queries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from shared.core.errors import ConflictError, NotFoundError, ValidationError
from shared.core.lifecycle import IllegalTransition, JobState, JobTrigger, TileState, TileTrigger
from shared.metadata import CommitOutcome, MetadataStore, NewJob, TileCommit
from tests.metadata.conftest import RECTS

Factory = Callable[..., NewJob]


async def _planned(store: MetadataStore, new_job: Factory) -> str:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS, node="sched")
    return job_id


async def _commit(store: MetadataStore, job_id: str, i: int, token: int, attempt: str) -> object:
    done = TileCommit(
        job_id,
        i,
        token=token,
        attempt_id=attempt,
        result_key=f"tiles/{job_id}/{i}/{attempt}",
        result_sha256=f"sha-{i}",
        samples_done=16,
        node="w",
    )
    return await store.commit_tile(done)


async def test_plan_is_idempotent(store: MetadataStore, new_job: Factory) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    first = await store.plan_tiles(job_id, RECTS, node="sched")
    again = await store.plan_tiles(job_id, RECTS, node="sched-2")
    assert first == again == await store.list_tiles(job_id)
    assert [t.rect for t in first] == RECTS and [t.tile_index for t in first] == [0, 1, 2, 3]
    assert all(t.state == TileState.QUEUED and t.lease_fence == 0 for t in first)
    job = await store.get_job(job_id)
    assert job is not None and (job.state, job.tiles_total) == (JobState.RUNNING, 4)
    planned = [e for e in await store.job_events(job_id) if e.trigger == JobTrigger.TILES_PLANNED]
    assert [(e.node, e.detail) for e in planned] == [("sched", "4 tiles")]


async def test_a_different_plan_is_refused(store: MetadataStore, new_job: Factory) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS)
    with pytest.raises(ConflictError, match="4 tiles, not 1"):
        await store.plan_tiles(job_id, [(0, 0, 64, 48)])
    with pytest.raises(ConflictError, match="different tile rectangles"):
        await store.plan_tiles(job_id, [(0, 0, 16, 16)] * 4)
    with pytest.raises(ValidationError):
        await store.plan_tiles(job_id, [])
    with pytest.raises(ValidationError, match="tile 0"):
        await store.plan_tiles(job_id, [(5, 5, 5, 9)])
    assert [t.rect for t in await store.list_tiles(job_id)] == RECTS
    with pytest.raises(NotFoundError):
        await store.plan_tiles("nope", RECTS)


async def test_concurrent_plans_insert_each_tile_once(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await asyncio.gather(*(store.plan_tiles(job_id, RECTS) for _ in range(6)))
    assert len(await store.list_tiles(job_id)) == 4


async def test_a_larger_token_wins_the_fence(store: MetadataStore, new_job: Factory) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 0, token=5, attempt_id="old", node="w1")
    assert await store.fence_tile(job_id, 0, token=9, attempt_id="new", node="w2", resumed_from=8)
    assert not await store.fence_tile(job_id, 0, token=7, attempt_id="late", node="w3")
    assert not await store.fence_tile(job_id, 0, token=9, attempt_id="same", node="w3")
    tile = await store.get_tile(job_id, 0)
    assert tile is not None
    assert (tile.state, tile.lease_fence, tile.attempt_count, tile.samples_done) == (
        TileState.LEASED,
        9,
        2,
        8,
    )
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.PROGRESSING
    attempts = {a.attempt_id: a for a in await store.attempts(job_id)}
    assert set(attempts) == {"old", "new"}
    assert (attempts["new"].fence, attempts["new"].resumed_from, attempts["new"].node) == (
        9,
        8,
        "w2",
    )
    leases = [e for e in await store.job_events(job_id) if e.trigger == TileTrigger.LEASE]
    assert [(e.attempt_id, e.from_state, e.to_state, e.detail) for e in leases] == [
        ("old", TileState.QUEUED, TileState.LEASED, "fence 5"),
        ("new", TileState.LEASED, TileState.LEASED, "fence 9"),
    ]


async def test_concurrent_fences_with_distinct_tokens_end_at_the_largest(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    tokens = list(range(1, 21))
    await asyncio.gather(
        *(store.fence_tile(job_id, 1, token=t, attempt_id=f"a{t}", node="w") for t in tokens)
    )
    tile = await store.get_tile(job_id, 1)
    assert tile is not None and tile.lease_fence == 20


async def test_the_stale_owner_is_refused_everywhere(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 2, token=5, attempt_id="stale", node="w1")
    assert await store.record_progress(job_id, 2, token=5, samples_done=4)
    assert await store.fence_tile(job_id, 2, token=6, attempt_id="fresh", node="w2")
    assert not await store.record_progress(job_id, 2, token=5, samples_done=12)
    assert await _commit(store, job_id, 2, 5, "stale") == CommitOutcome.FENCED
    refused = await store.fail_tile(
        job_id,
        2,
        token=5,
        attempt_id="stale",
        trigger=TileTrigger.RETRYABLE_FAILURE,
        error_code="unavailable",
        error="late",
        node="w1",
        outcome="retryable",
    )
    assert refused is None
    tile = await store.get_tile(job_id, 2)
    assert tile is not None
    assert (tile.state, tile.lease_fence, tile.samples_done, tile.result_key) == (
        TileState.LEASED,
        6,
        0,
        None,
    )
    outcomes = {a.attempt_id: a.outcome for a in await store.attempts(job_id)}
    assert outcomes == {"stale": "fenced", "fresh": None}


async def test_progress_then_commit_then_duplicate_commit(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 3, token=2, attempt_id="a", node="w")
    assert await store.record_progress(job_id, 3, token=2, samples_done=4, node="w")
    assert await store.record_progress(job_id, 3, token=2, samples_done=8, node="w")
    tile = await store.get_tile(job_id, 3)
    assert tile is not None and (tile.state, tile.samples_done) == (TileState.PROGRESSING, 8)
    assert await _commit(store, job_id, 3, 2, "a") == CommitOutcome.COMMITTED
    assert await _commit(store, job_id, 3, 2, "a") == CommitOutcome.ALREADY_DONE
    assert await _commit(store, job_id, 3, 1, "b") == CommitOutcome.ALREADY_DONE
    assert not await store.fence_tile(job_id, 3, token=3, attempt_id="c", node="w")
    assert not await store.record_progress(job_id, 3, token=2, samples_done=1)
    tile = await store.get_tile(job_id, 3)
    assert tile is not None
    assert (tile.state, tile.result_sha256, tile.samples_done) == (TileState.DONE, "sha-3", 16)
    tile_events = [
        (e.from_state, e.to_state, e.trigger)
        for e in await store.job_events(job_id)
        if e.tile_index == 3
    ]
    assert tile_events == [
        (TileState.QUEUED, TileState.LEASED, TileTrigger.LEASE),
        (TileState.LEASED, TileState.PROGRESSING, TileTrigger.PROGRESS),
        (TileState.PROGRESSING, TileState.DONE, TileTrigger.COMMIT),
    ]
    outcomes = {a.attempt_id: a.outcome for a in await store.attempts(job_id)}
    assert outcomes == {"a": "done"}


async def test_racing_commits_of_two_owners_commit_once(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 0, token=1, attempt_id="a", node="w1")
    assert await store.fence_tile(job_id, 0, token=2, attempt_id="b", node="w2")
    results = await asyncio.gather(
        *(_commit(store, job_id, 0, token, name) for token, name in [(1, "a"), (2, "b")] * 3)
    )
    assert results.count(CommitOutcome.COMMITTED) == 1
    assert set(results) <= {
        CommitOutcome.COMMITTED,
        CommitOutcome.FENCED,
        CommitOutcome.ALREADY_DONE,
    }
    tile = await store.get_tile(job_id, 0)
    assert tile is not None and tile.result_key == f"tiles/{job_id}/0/b"


async def test_fail_tile_records_outcome_audit_and_optional_job_move(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 0, token=3, attempt_id="a", node="w")
    tile = await store.fail_tile(
        job_id,
        0,
        token=3,
        attempt_id="a",
        trigger=TileTrigger.TERMINAL_FAILURE,
        error_code="invalid_scene",
        error="no camera",
        node="w",
        outcome="terminal",
        job_trigger=JobTrigger.TERMINAL_FAILURE,
    )
    assert tile is not None
    assert (tile.state, tile.last_error_code, tile.last_error) == (
        TileState.FAILED_TERMINAL,
        "invalid_scene",
        "no camera",
    )
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.FAILED_TERMINAL
    assert job.last_error_code == "invalid_scene"
    (attempt,) = await store.attempts(job_id)
    assert (attempt.outcome, attempt.error_code, attempt.ended_at is not None) == (
        "terminal",
        "invalid_scene",
        True,
    )
    last = (await store.job_events(job_id))[-1]
    assert (last.tile_index, last.to_state, last.error_code, last.attempt_id) == (
        0,
        TileState.FAILED_TERMINAL,
        "invalid_scene",
        "a",
    )
    # A terminal tile cannot fail again, and the job (terminal) is not fenced for new work.
    with pytest.raises(IllegalTransition, match="tile 0 of job"):
        await store.fail_tile(
            job_id,
            0,
            token=None,
            attempt_id=None,
            trigger=TileTrigger.RETRYABLE_FAILURE,
            error_code="x",
            error="x",
            node="w",
            outcome="retryable",
        )
    assert not await store.fence_tile(job_id, 1, token=9, attempt_id="b", node="w")
    with pytest.raises(ValidationError, match="attempt outcome"):
        await store.end_attempt("a", outcome="exploded")


async def test_lease_lost_hands_the_tile_back(store: MetadataStore, new_job: Factory) -> None:
    job_id = await _planned(store, new_job)
    assert await store.fence_tile(job_id, 1, token=4, attempt_id="a", node="w")
    tile = await store.fail_tile(
        job_id,
        1,
        token=4,
        attempt_id="a",
        trigger=TileTrigger.LEASE_LOST,
        error_code="lease_lost",
        error="renew failed",
        node="w",
        outcome="lease_lost",
    )
    assert tile is not None and tile.state == TileState.QUEUED and tile.lease_fence == 4
    assert await _commit(store, job_id, 1, 4, "a") == CommitOutcome.FENCED
    await store.end_attempt("a", outcome="done")  # first outcome wins
    (attempt,) = await store.attempts(job_id)
    assert attempt.outcome == "lease_lost"


async def test_counts_and_all_done_and_finalization(store: MetadataStore, new_job: Factory) -> None:
    job_id = await _planned(store, new_job)
    counts = await store.tile_counts(job_id)
    assert (counts.total, counts.done, counts.by_state[TileState.QUEUED]) == (4, 0, 4)
    for i in range(4):
        assert not await store.all_tiles_done(job_id)
        assert await store.fence_tile(job_id, i, token=i + 1, attempt_id=f"a{i}", node="w")
        assert await _commit(store, job_id, i, i + 1, f"a{i}") == CommitOutcome.COMMITTED
    counts = await store.tile_counts(job_id)
    assert (counts.total, counts.done, counts.samples_done) == (4, 4, 64)
    assert await store.all_tiles_done(job_id)
    job = await store.transition_job(job_id, JobTrigger.ALL_TILES_DONE, node="fz")
    assert job.state == JobState.FINALIZING
    empty = await store.tile_counts("nope")
    assert (empty.total, empty.done, empty.samples_done) == (0, 0, 0)
    with pytest.raises(NotFoundError):
        await store.all_tiles_done("nope")


async def test_stale_tiles_selects_open_tiles_of_live_jobs(
    store: MetadataStore, new_job: Factory, database_url: str
) -> None:
    live = await _planned(store, new_job)
    cancelled = await _planned(store, new_job)
    await store.request_cancel(cancelled)
    await store.mark_published(live, [0, 1, 2, 3], generation=0)
    assert await store.fence_tile(live, 3, token=1, attempt_id="a", node="w")
    assert await _commit(store, live, 3, 1, "a") == CommitOutcome.COMMITTED
    assert await store.stale_tiles(older_than=60) == []
    conn = await asyncpg.connect(database_url)
    try:  # age two publishes instead of sleeping
        await conn.execute(
            "UPDATE tiles SET published_at = now() - interval '2 minutes' "
            "WHERE job_id = $1 AND tile_index = ANY($2::int[])",
            live,
            [1, 2, 3],
        )
    finally:
        await conn.close()
    stale = await store.stale_tiles(older_than=60)
    assert [(t.job_id, t.tile_index) for t in stale] == [(live, 1), (live, 2)]
    assert [t.tile_index for t in await store.stale_tiles(older_than=60, limit=1)] == [1]
    await store.mark_published(live, [1], generation=1)
    assert [t.tile_index for t in await store.stale_tiles(older_than=60)] == [2]
    tile = await store.get_tile(live, 1)
    assert tile is not None and tile.generation == 1
    await store.mark_published(live, [1], generation=0)  # a stale publisher cannot go back
    tile = await store.get_tile(live, 1)
    assert tile is not None and tile.generation == 1


async def test_unreleased_tiles_are_never_stale(
    store: MetadataStore, new_job: Factory, database_url: str
) -> None:
    """An unreleased tile (``published_at`` NULL) waits for the dispatcher by design, however
    old its row; once released, it is stale after the age like any published one."""
    job_id = await _planned(store, new_job)
    conn = await asyncpg.connect(database_url)
    try:  # planned two minutes ago, never released
        await conn.execute(
            "UPDATE tiles SET updated_at = now() - interval '2 minutes' WHERE job_id = $1", job_id
        )
        assert await store.stale_tiles(older_than=60) == []
        released = await store.release_tiles({"tessera": 10}, limit=10, usage_window=300)
        assert len(released.tiles) == 4
        assert await store.stale_tiles(older_than=60) == [], "released just now"
        await conn.execute(
            "UPDATE tiles SET published_at = now() - interval '2 minutes' WHERE job_id = $1",
            job_id,
        )
    finally:
        await conn.close()
    assert [t.tile_index for t in await store.stale_tiles(older_than=60)] == [0, 1, 2, 3]
    assert await store.stale_tiles(older_than=3600) == []


async def test_claim_lost_tiles_rechecks_and_bumps_in_one_step(
    store: MetadataStore, new_job: Factory, database_url: str
) -> None:
    job_id = await _planned(store, new_job)
    await store.mark_published(job_id, [0, 1, 2, 3], generation=0)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE tiles SET published_at = now() - interval '2 minutes' WHERE job_id = $1",
            job_id,
        )
    finally:
        await conn.close()
    seen = await store.stale_tiles(older_than=60)
    assert [t.tile_index for t in seen] == [0, 1, 2, 3]
    # Between the read and the claim: tile 0 is committed, tile 1 fenced by a new owner,
    # tile 2 published again by the planner; tile 3 is untouched.
    assert await store.fence_tile(job_id, 0, token=1, attempt_id="a", node="w")
    assert await _commit(store, job_id, 0, 1, "a") == CommitOutcome.COMMITTED
    assert await store.fence_tile(job_id, 1, token=2, attempt_id="b", node="w")
    await store.mark_published(job_id, [2], generation=0)
    claimed = await store.claim_lost_tiles(seen, older_than=60)
    assert [(t.tile_index, t.generation) for t in claimed] == [(3, 1)]
    tile = await store.get_tile(job_id, 3)
    assert tile is not None and tile.generation == 1 and tile.published_at is not None
    assert await store.claim_lost_tiles(seen, older_than=60) == []  # claimed once only
    # tile 1 is stale again on the next sweep (for its broker checks: the new owner's lease)
    assert [t.tile_index for t in await store.stale_tiles(older_than=60)] == [1]
    assert [t.generation for t in await store.list_tiles(job_id)] == [0, 0, 0, 1]


async def test_many_workers_on_one_job_keep_every_row_consistent(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job(width=128, height=128))).job.job_id
    rects = [(x, y, x + 32, y + 32) for y in range(0, 128, 32) for x in range(0, 128, 32)]
    await store.plan_tiles(job_id, rects)

    async def work(i: int) -> object:
        token = 100 + i
        assert await store.fence_tile(job_id, i, token=token, attempt_id=f"a{i}", node=f"w{i}")
        for samples in (4, 8, 12):
            assert await store.record_progress(job_id, i, token=token, samples_done=samples)
        return await _commit(store, job_id, i, token, f"a{i}")

    results = await asyncio.gather(*(work(i) for i in range(len(rects))))
    assert results == [CommitOutcome.COMMITTED] * len(rects)
    assert await store.all_tiles_done(job_id)
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.PROGRESSING
    job_moves = [e for e in await store.job_events(job_id) if e.entity == "job"]
    assert [(e.from_state, e.to_state) for e in job_moves] == [
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.RUNNING, JobState.PROGRESSING),
    ]
    tile_moves = [e for e in await store.job_events(job_id) if e.entity == "tile"]
    assert len(tile_moves) == 3 * len(rects)  # lease, first progress, commit


async def test_no_new_work_on_a_cancel_requested_job(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    await store.request_cancel(job_id)
    assert not await store.fence_tile(job_id, 0, token=1, attempt_id="a", node="w")
    with pytest.raises(NotFoundError):
        await store.fence_tile(job_id, 99, token=1, attempt_id="a", node="w")
    assert await store.attempts(job_id) == []


async def test_a_late_plan_redelivery_after_planning_moves_nothing(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    await store.transition_job(job_id, JobTrigger.ALL_TILES_DONE)
    assert [t.rect for t in await store.plan_tiles(job_id, RECTS)] == RECTS
    job = await store.get_job(job_id)
    assert job is not None and job.state == JobState.FINALIZING
    unplanned = (await store.submit_job(new_job())).job.job_id
    await store.request_cancel(unplanned)
    with pytest.raises(IllegalTransition, match="tiles_planned is illegal in state cancelled"):
        await store.plan_tiles(unplanned, RECTS)
    assert await store.list_tiles(unplanned) == []


async def test_an_unfenced_failure_without_attempt_records_no_outcome(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _planned(store, new_job)
    tile = await store.fail_tile(
        job_id,
        0,
        token=None,
        attempt_id=None,
        trigger=TileTrigger.DEAD_LETTER,
        error_code="max_deliver",
        error="delivered 5 times",
        node="sched",
        outcome="dead_lettered",  # not an attempt outcome, but there is no attempt to close
    )
    assert tile is not None and tile.state == TileState.DEAD_LETTERED
    with pytest.raises(ValidationError, match="attempt outcome"):
        await store.fail_tile(
            job_id,
            1,
            token=None,
            attempt_id="a1",
            trigger=TileTrigger.DEAD_LETTER,
            error_code="x",
            error="x",
            node="sched",
            outcome="dead_lettered",
        )
    tile = await store.get_tile(job_id, 1)
    assert tile is not None and tile.state == TileState.QUEUED


async def test_a_requeue_that_revives_the_job_hands_its_other_tiles_to_the_dispatcher(
    store: MetadataStore, new_job: Factory
) -> None:
    # A dead-lettered job: tile 0 the poison, tile 1 stopped failed_terminal with the job (its
    # owner saw the job end), tile 2 released and idle, tile 3 done.
    job_id = await _planned(store, new_job)
    await store.mark_published(job_id, [0, 1, 2, 3], 0)
    for i, token in ((0, 5), (1, 6), (3, 7)):
        assert await store.fence_tile(job_id, i, token=token, attempt_id=f"a{i}", node="w")
    assert await _commit(store, job_id, 3, 7, "a3") is CommitOutcome.COMMITTED
    await store.fail_tile(
        job_id, 0, token=5, attempt_id="a0", trigger=TileTrigger.DEAD_LETTER, error_code="p",
        error="poison", node="w", outcome="terminal", job_trigger=JobTrigger.DEAD_LETTER,
    )  # fmt: skip
    await store.fail_tile(
        job_id, 1, token=6, attempt_id="a1", trigger=TileTrigger.TERMINAL_FAILURE,
        error_code="p", error="job ended", node="w", outcome="terminal",
    )  # fmt: skip
    before = {t.tile_index: t for t in await store.list_tiles(job_id)}
    requeued = await store.ops.requeue_tile(job_id, 0, node="ops")
    assert requeued.job_requeued and requeued.job.state is JobState.QUEUED
    after = {t.tile_index: t for t in await store.list_tiles(job_id)}
    # the requeued tile is published by the requeue itself: one generation on, still released
    assert after[0].state is TileState.QUEUED and after[0].generation == before[0].generation + 1
    assert after[0].published_at is not None
    # stamped now: the sweeper counts the tile's age from the requeue's own publish, not from
    # its release before it failed (else a worker slow to take it would see it re-published)
    assert before[0].published_at is not None and after[0].published_at > before[0].published_at
    # its sibling failed with the job goes back too, and the idle one is unreleased under a new
    # generation (a message of it still in TILES is then superseded); done stays done
    assert after[1].state is TileState.QUEUED and after[1].last_error_code is None
    assert after[2].state is TileState.QUEUED and after[2].published_at is None
    assert after[2].generation == before[2].generation + 1
    assert after[3].state is TileState.DONE and after[3].generation == before[3].generation
    released = await store.release_tiles({"tessera": 10}, limit=10, usage_window=300)
    assert sorted(t.tile_index for t in released.tiles) == [1, 2], "the dispatcher takes them"
