"""The one-statement fence and commit write exactly what the transactions write, or decline.

Every combination of tile state, job state, cancel flag and fence relation is set up twice, on
two identical jobs: the fast path runs on one, the transaction (the authority) on the other.
Where the fast path takes the case, both must leave the same rows (tile, attempts, audit trail,
inline result); where it declines, it must have written nothing at all.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from shared.errors import ValidationError
from shared.lifecycle import JobState, JobTrigger, TileState, TileTrigger, tile_legal_events
from shared.metadata import CommitOutcome, MetadataStore, NewJob, fastpath, fencing
from shared.metadata.audit import Who
from tests.metadata.conftest import RECTS

Factory = Callable[..., NewJob]
TOKEN = 50


async def _job(store: MetadataStore, new_job: Factory) -> str:
    job_id = (await store.submit_job(new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS, node="sched")
    return job_id


async def _force(
    store: MetadataStore,
    job_id: str,
    *,
    tile: TileState,
    fence: int,
    attempts: int,
    job: JobState,
    cancel: bool,
) -> None:
    async def run(conn: Any) -> None:
        await conn.execute(
            "UPDATE tiles SET state = $2, lease_fence = $3, attempt_count = $4"
            " WHERE job_id = $1 AND tile_index = 0",
            job_id,
            tile.value,
            fence,
            attempts,
        )
        await conn.execute(
            "UPDATE jobs SET state = $2, cancel_requested = $3 WHERE job_id = $1",
            job_id,
            job.value,
            cancel,
        )

    await store._tx("force", run)


async def _rows(store: MetadataStore, job_id: str) -> dict[str, Any]:
    """What a write can change, without ids, job ids and clocks."""
    tile = await store.get_tile(job_id, 0)
    assert tile is not None
    job = await store.get_job(job_id)
    assert job is not None
    events: list[tuple[Any, ...]] = [
        (e.tile_index, e.attempt_id, e.node, e.entity, e.from_state, e.to_state, e.trigger,
         e.error_code, e.error, e.detail)
        for e in await store.job_events(job_id)
    ]  # fmt: skip
    attempts: list[tuple[Any, ...]] = [
        (a.attempt_id, a.tile_index, a.kind, a.node, a.fence, a.resumed_from,
         a.ended_at is None, a.outcome, a.error_code, a.error)
        for a in await store.attempts(job_id)
    ]  # fmt: skip
    mine = f"att-{job_id}"
    events = [tuple("ATT" if v == mine else v for v in e) for e in events]
    attempts = [tuple("ATT" if v == mine else v for v in a) for a in attempts]
    kept = dataclasses.asdict(tile)
    for volatile in ("job_id", "updated_at", "published_at"):
        kept.pop(volatile)
    return {
        "tile": kept,
        "job": (job.state, job.cancel_requested, job.last_error_code),
        "events": events,
        "attempts": attempts,
        "inline": await store.tile_results(job_id),
    }


async def _slow_fence(conn: Any, *, job_id: str) -> bool:
    who = Who("w1", f"att-{job_id}")
    return await fencing.fence(
        conn, job_id, 0, token=TOKEN, attempt_id=f"att-{job_id}", who=who, resumed_from=3
    )


@pytest.mark.parametrize("tile_state", list(TileState), ids=str)
async def test_fence_fast_path_matches_the_transaction(
    store: MetadataStore, new_job: Factory, tile_state: TileState
) -> None:
    taken = 0
    for job_state, cancel, fence, attempts in itertools.product(
        list(JobState), [False, True], [0, TOKEN - 1, TOKEN], [0, 1]
    ):
        fast_job, slow_job = await _job(store, new_job), await _job(store, new_job)
        for job_id in (fast_job, slow_job):
            await _force(store, job_id, tile=tile_state, fence=fence, attempts=attempts,
                         job=job_state, cancel=cancel)  # fmt: skip
        seen = await store.get_tile(fast_job, 0)
        assert seen is not None
        before = await _rows(store, fast_job)
        who = Who("w1", f"att-{fast_job}", detail=f"fence {TOKEN}")
        fast = await store._statement(
            "fence", partial(fastpath.fence, seen=seen, token=TOKEN, who=who, resumed_from=3)
        )
        case = (job_state, cancel, fence, attempts)
        if not fast:
            assert await _rows(store, fast_job) == before, f"declined but wrote: {case}"
            continue
        taken += 1
        slow = await store._tx(
            "fence",
            partial(_slow_fence, job_id=slow_job),
        )
        assert slow is True, f"fast path fenced what the transaction refuses: {case}"
        assert await _rows(store, fast_job) == await _rows(store, slow_job), case
    if TileTrigger.LEASE in tile_legal_events(tile_state):
        # the common case: never leased, job progressing, no cancel, fence below the token
        assert taken == 2, f"{tile_state}: the two never-leased cases below the token"
    else:
        assert taken == 0


def _commit_args(job_id: str, inline: bool) -> dict[str, Any]:
    return {
        "tile_index": 0,
        "token": TOKEN,
        "result_key": None if inline else "tiles/x/0/abc.npy",
        "result_sha256": "abc",
        "result_data": b"npy bytes" if inline else None,
        "samples_done": 16,
        "who": Who("w1", f"att-{job_id}"),
    }


@pytest.mark.parametrize("tile_state", list(TileState), ids=str)
@pytest.mark.parametrize("inline", [False, True], ids=["object", "inline"])
async def test_commit_fast_path_matches_the_transaction(
    store: MetadataStore, new_job: Factory, tile_state: TileState, inline: bool
) -> None:
    taken = 0
    for job_state, fence in itertools.product(list(JobState), [TOKEN - 1, TOKEN]):
        jobs = [await _job(store, new_job), await _job(store, new_job)]
        for job_id in jobs:
            assert await store.fence_tile(job_id, 0, token=TOKEN, attempt_id=f"att-{job_id}",
                                          node="w1")  # fmt: skip
            await _force(store, job_id, tile=tile_state, fence=fence, attempts=1,
                         job=job_state, cancel=False)  # fmt: skip
        fast_job, slow_job = jobs
        before = await _rows(store, fast_job)

        fast = await store._statement(
            "commit", partial(fastpath.commit, job_id=fast_job, **_commit_args(fast_job, inline))
        )
        case = (job_state, fence)
        if not fast:
            assert await _rows(store, fast_job) == before, f"declined but wrote: {case}"
            continue
        taken += 1
        slow = await store._tx(
            "commit", partial(fencing.commit, job_id=slow_job, **_commit_args(slow_job, inline))
        )
        assert slow is CommitOutcome.COMMITTED, case
        fast_rows, slow_rows = await _rows(store, fast_job), await _rows(store, slow_job)
        assert fast_rows == slow_rows, case
        assert fast_rows["inline"] == ({0: ("abc", b"npy bytes")} if inline else {})
    if tile_state in (TileState.LEASED, TileState.PROGRESSING):
        assert taken == 1, "the tile leased under this token, its job progressing"
    else:
        assert taken == 0


async def test_commit_needs_exactly_one_of_key_and_data(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _job(store, new_job)
    assert await store.fence_tile(job_id, 0, token=TOKEN, attempt_id="a", node="w")
    for key, data in (("tiles/k", b"d"), (None, None)):
        with pytest.raises(ValidationError, match="exactly one"):
            await store.commit_tile(job_id, 0, token=TOKEN, attempt_id="a", result_key=key,
                                    result_data=data, result_sha256="s", samples_done=1,
                                    node="w")  # fmt: skip


def test_fast_paths_cover_only_quiet_job_states() -> None:
    assert fastpath.quiet_job_states(JobTrigger.TILE_STARTED) == ["progressing"]
    assert fastpath.quiet_job_states(JobTrigger.TILE_PROGRESS) == ["progressing"]
