"""Jobs: idempotent submit, compare-and-set transitions, audit, cancel, retry, completion."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from shared.core.errors import ConflictError, NotFoundError, ValidationError
from shared.core.lifecycle import IllegalTransition, JobState, JobTrigger, TileState, TileTrigger
from shared.metadata import SUBMIT_TRIGGER, MetadataStore, NewJob
from tests.metadata.conftest import RECTS

Factory = Callable[..., NewJob]


async def _job_rows(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM jobs"))
    finally:
        await conn.close()


async def test_100_concurrent_submits_of_one_request_make_one_job(
    store: MetadataStore, new_job: Factory, database_url: str
) -> None:
    # Each submit carries its own fresh job_id, as the gateway would mint one per request.
    template = new_job(key="same-key")
    submits = [new_job(key="same-key", body=template.request) for _ in range(100)]
    results = await asyncio.gather(*(store.submit_job(s) for s in submits))
    assert sum(r.created for r in results) == 1
    assert len({r.job.job_id for r in results}) == 1
    assert await _job_rows(database_url) == 1
    events = await store.job_events(results[0].job.job_id)
    assert [(e.from_state, e.to_state, e.trigger) for e in events] == [
        (None, JobState.QUEUED, SUBMIT_TRIGGER)
    ]


async def test_same_key_other_body_is_a_conflict_naming_the_key(
    store: MetadataStore, new_job: Factory
) -> None:
    first = await store.submit_job(new_job(key="k1"))
    with pytest.raises(ConflictError, match="'k1'"):
        await store.submit_job(new_job(key="k1", body={"spp": 999}))
    assert (await store.get_job(first.job.job_id)) == first.job


async def test_submit_round_trips_every_column(store: MetadataStore, new_job: Factory) -> None:
    new = new_job(scene={"big": ["x" * 1000] * 2000, "nested": {"a": [1, 2.5, None, True]}})
    job = (await store.submit_job(new)).job
    assert job == await store.get_job(new.job_id)
    assert (job.scene, job.request, job.state) == (new.scene, new.request, JobState.QUEUED)
    assert (job.tiles_total, job.generation, job.cancel_requested) == (0, 0, False)
    assert job.finished_at is None and job.result_location is None
    assert await store.get_job("missing") is None


async def test_list_jobs_pages_newest_first_and_filters_by_state(
    store: MetadataStore, new_job: Factory
) -> None:
    # UUIDv7 orders by millisecond; within one millisecond the random tail decides, so the
    # expected order is the ids' own order (which is what "newest first" means at ms grain).
    ids = sorted([(await store.submit_job(new_job())).job.job_id for _ in range(5)])
    await store.request_cancel(ids[1])
    first = await store.list_jobs(limit=2)
    second = await store.list_jobs(limit=2, before=first[-1].job_id)
    rest = await store.list_jobs(limit=10, before=second[-1].job_id)
    assert [j.job_id for j in first + second + rest] == ids[::-1]
    assert [j.job_id for j in await store.list_jobs(state=JobState.CANCELLED)] == [ids[1]]
    queued = await store.list_jobs(state=JobState.QUEUED, limit=2, before=ids[3])
    assert [j.job_id for j in queued] == [ids[2], ids[0]]
    with pytest.raises(ValidationError):
        await store.list_jobs(limit=0)


async def test_transition_is_audited_with_who_and_why(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.transition_job(job_id, JobTrigger.TILES_PLANNED, node="sched-1")
    job = await store.transition_job(
        job_id,
        JobTrigger.RETRYABLE_FAILURE,
        node="w-7",
        attempt_id="att-1",
        error_code="unavailable",
        error="object store timed out",
        detail="tile 3",
    )
    assert (job.state, job.last_error_code, job.last_error) == (
        JobState.FAILED_RETRYABLE,
        "unavailable",
        "object store timed out",
    )
    last = (await store.job_events(job_id))[-1]
    assert (last.entity, last.tile_index, last.from_state, last.to_state, last.trigger) == (
        "job",
        None,
        JobState.RUNNING,
        JobState.FAILED_RETRYABLE,
        JobTrigger.RETRYABLE_FAILURE,
    )
    assert (last.node, last.attempt_id, last.error_code, last.error, last.detail) == (
        "w-7",
        "att-1",
        "unavailable",
        "object store timed out",
        "tile 3",
    )


async def test_self_loops_are_legal_and_not_audited(store: MetadataStore, new_job: Factory) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    first = await store.transition_job(job_id, JobTrigger.TILES_PLANNED)
    again = await store.transition_job(job_id, JobTrigger.TILES_PLANNED)
    assert first == again and again.state == JobState.RUNNING
    assert len(await store.job_events(job_id)) == 2  # submit + the one real move
    noted = await store.transition_job(job_id, JobTrigger.TILES_PLANNED, error_code="slow")
    assert (noted.state, noted.last_error_code) == (JobState.RUNNING, "slow")
    assert len(await store.job_events(job_id)) == 2


async def test_illegal_transition_raises_and_changes_nothing(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    before = await store.get_job(job_id)
    with pytest.raises(IllegalTransition, match="finalized is illegal in state queued"):
        await store.transition_job(job_id, JobTrigger.FINALIZED)
    with pytest.raises(IllegalTransition, match="expected state running, but the job is queued"):
        await store.transition_job(job_id, JobTrigger.TILES_PLANNED, expected=JobState.RUNNING)
    assert await store.get_job(job_id) == before
    assert len(await store.job_events(job_id)) == 1
    with pytest.raises(NotFoundError):
        await store.transition_job("nope", JobTrigger.CANCEL)


async def test_conflicting_concurrent_transitions_never_lose_an_update(
    store: MetadataStore, new_job: Factory
) -> None:
    for _ in range(10):
        job_id = (await store.submit_job(new_job())).job.job_id
        await store.transition_job(job_id, JobTrigger.TILES_PLANNED)
        # Both start from "running": cancel and all_tiles_done conflict; whichever commits
        # second sees the winner's state (a CAS miss, then a fresh read) and must be legal
        # from there or raise. Either way the trail explains the final state.
        results = await asyncio.gather(
            store.transition_job(job_id, JobTrigger.CANCEL),
            store.transition_job(job_id, JobTrigger.ALL_TILES_DONE),
            return_exceptions=True,
        )
        job = await store.get_job(job_id)
        assert job is not None
        moves = [(e.from_state, e.to_state) for e in (await store.job_events(job_id))[2:]]
        assert moves[-1][1] == job.state == JobState.CANCELLED
        if any(isinstance(r, BaseException) for r in results):  # cancel first; then illegal
            assert isinstance(results[1], IllegalTransition)
            assert moves == [(JobState.RUNNING, JobState.CANCELLED)]
        else:  # finalizing first, then cancelled from finalizing: both legal, in sequence
            assert moves == [
                (JobState.RUNNING, JobState.FINALIZING),
                (JobState.FINALIZING, JobState.CANCELLED),
            ]


async def test_explicit_expected_state_is_a_compare_and_set(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    results = await asyncio.gather(
        *(
            store.transition_job(job_id, JobTrigger.TILES_PLANNED, expected=JobState.QUEUED)
            for _ in range(8)
        ),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, IllegalTransition) for r in results if isinstance(r, BaseException))
    assert len(await store.job_events(job_id)) == 2


async def test_terminal_states_set_finished_at(store: MetadataStore, new_job: Factory) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    job = await store.transition_job(job_id, JobTrigger.TERMINAL_FAILURE, error_code="invalid")
    assert job.state == JobState.FAILED_TERMINAL and job.finished_at is not None


async def test_cancel_flags_the_job_and_stops_idle_tiles(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS)
    assert await store.fence_tile(job_id, 0, token=1, attempt_id="a0", node="w")
    assert not await store.is_cancel_requested(job_id)
    job = await store.request_cancel(job_id, node="gw")
    assert job.state == JobState.CANCELLED and job.cancel_requested
    assert await store.is_cancel_requested(job_id)
    states = [t.state for t in await store.list_tiles(job_id)]
    assert states == [TileState.LEASED] + [TileState.CANCELLED] * 3  # the owner stops tile 0
    with pytest.raises(IllegalTransition):
        await store.request_cancel(job_id)
    with pytest.raises(NotFoundError):
        await store.is_cancel_requested("nope")


async def test_retry_requeues_failed_tiles_in_one_transaction(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS)
    for i, (trigger, outcome) in enumerate(
        [(TileTrigger.RETRYABLE_FAILURE, "retryable"), (TileTrigger.TERMINAL_FAILURE, "terminal")]
    ):
        assert await store.fence_tile(job_id, i, token=10 + i, attempt_id=f"a{i}", node="w")
        await store.fail_tile(
            job_id,
            i,
            token=10 + i,
            attempt_id=f"a{i}",
            trigger=trigger,
            error_code="boom",
            error="kernel failed",
            node="w",
            outcome=outcome,
        )
    await store.fail_tile(
        job_id,
        2,
        token=None,
        attempt_id=None,
        trigger=TileTrigger.DEAD_LETTER,
        error_code="max_deliver",
        error="poison",
        node="sched",
        outcome="terminal",
        job_trigger=JobTrigger.DEAD_LETTER,
    )
    dead = await store.get_job(job_id)
    assert dead is not None and dead.state == JobState.DEAD_LETTERED
    assert dead.last_error_code == "max_deliver"
    job = await store.retry_job(job_id, node="op")
    assert (job.state, job.generation, job.last_error_code, job.finished_at) == (
        JobState.QUEUED,
        1,
        None,
        None,
    )
    tiles = await store.list_tiles(job_id)
    assert [t.state for t in tiles] == [TileState.QUEUED] * 4
    assert [t.generation for t in tiles] == [1, 1, 1, 0]
    assert [t.lease_fence for t in tiles] == [10, 11, 0, 0]  # fences never go backwards
    requeues = [e for e in await store.job_events(job_id) if e.trigger == TileTrigger.REQUEUE]
    assert sorted((e.tile_index, e.from_state) for e in requeues) == [
        (0, TileState.FAILED_RETRYABLE),
        (1, TileState.FAILED_TERMINAL),
        (2, TileState.DEAD_LETTERED),
    ]
    with pytest.raises(IllegalTransition):
        await store.retry_job(job_id)


async def test_complete_job_is_idempotent_for_the_same_sha(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.transition_job(job_id, JobTrigger.TILES_PLANNED)
    with pytest.raises(IllegalTransition):
        await store.complete_job(job_id, result_location="r", result_sha256="s", float_location="f")
    await store.transition_job(job_id, JobTrigger.ALL_TILES_DONE)
    await store.start_final_attempt(job_id, attempt_id="fin-1", node="fz", fence=42)
    results = await asyncio.gather(
        *(
            store.complete_job(
                job_id,
                result_location=f"renders/{job_id}/abc.png",
                result_sha256="abc",
                float_location=f"renders/{job_id}/abc.exr",
                node="fz",
                attempt_id="fin-1",
            )
            for _ in range(5)
        )
    )
    assert all(r == results[0] for r in results)
    job = results[0]
    assert (job.state, job.result_sha256, job.result_location) == (
        JobState.COMPLETED,
        "abc",
        f"renders/{job_id}/abc.png",
    )
    assert job.finished_at is not None
    with pytest.raises(ConflictError, match="already completed with sha256 abc"):
        await store.complete_job(
            job_id, result_location="r2", result_sha256="other", float_location="f2"
        )
    assert await store.get_job(job_id) == job
    completions = [e for e in await store.job_events(job_id) if e.trigger == JobTrigger.FINALIZED]
    assert len(completions) == 1 and completions[0].attempt_id == "fin-1"
    (attempt,) = await store.attempts(job_id)
    assert (attempt.kind, attempt.tile_index, attempt.fence, attempt.outcome) == (
        "final",
        None,
        42,
        "done",
    )
