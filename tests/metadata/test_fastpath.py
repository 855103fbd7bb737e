"""The fence and the commit have one owner per case, and the store sends each case to its owner.

The single statement (:mod:`shared.metadata.fastpath`) owns the plain case: a tile never leased
before, of a ``progressing`` job, fenced or committed under the caller's token. The transaction
(:mod:`shared.metadata.fencing`) owns the rest: refusals, the job's moves and takeovers, and
writes through the same statement. Every combination of tile state, job state, cancel flag and
fence relation is set up on twin jobs: the owner runs alone on one, the store's own dispatch on
the other; both must answer the same and leave the same rows, the statement must take exactly
the plain cases (and write nothing where it declines), and the store must run the transaction
for every other case only.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from shared.core.errors import ValidationError
from shared.core.lifecycle import JobState, JobTrigger, TileState, TileTrigger, tile_legal_events
from shared.metadata import (
    CommitOutcome,
    MetadataStore,
    NewJob,
    Tile,
    TileCommit,
    TileFence,
    fastpath,
    fencing,
)
from shared.metadata.audit import ABANDONED, Conn
from tests.metadata.conftest import RECTS

Factory = Callable[..., NewJob]
T = TypeVar("T")
TOKEN = 50


class Recording(MetadataStore):
    """The real store, noting which runner each call went through (the dispatch under test)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[str] = []

    async def _statement(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T | None:
        self.ran.append(f"statement {what}")
        return await super()._statement(what, fn)

    async def _tx(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        self.ran.append(f"tx {what}")
        return await super()._tx(what, fn)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Recording]:
    opened = await Recording.connect(database_url, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


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


def _lease(job_id: str) -> TileFence:
    return TileFence(job_id, 0, TOKEN, f"att-{job_id}", "w1")


async def _fence(db: Recording, job_id: str) -> bool:
    """The store's fence of tile 0 as a worker calls it: the one statement, for a message of
    the tile's generation, then the transaction where it declined."""
    seen = await db.get_tile(job_id, 0)
    assert seen is not None
    db.ran.clear()
    lease = _lease(job_id)
    first = await db.fence_first(job_id, 0, token=TOKEN, attempt_id=lease.attempt_id, node="w1",
                                 generation=seen.generation)  # fmt: skip
    assert first.tile == seen, "the row as it was comes back, fenced or not"
    if first.fenced:
        return True
    return await db.fence_tile(job_id, 0, token=TOKEN, attempt_id=lease.attempt_id, node="w1")


async def _statement_fence(db: Recording, lease: TileFence, seen: Tile) -> bool:
    """The statement alone, for a message of ``seen``'s generation; asserts it returned the row."""
    first = await db._statement("fence", lambda c: fastpath.fence(c, lease, seen.generation))
    assert first is not None and first.tile == seen
    return first.fenced


def _fenced_rows(before: dict[str, Any], state: TileState) -> dict[str, Any]:
    """``before`` plus what the statement writes for a fence of tile 0 from ``state``."""
    tile = before["tile"] | {"state": TileState.LEASED, "lease_fence": TOKEN, "attempt_count": 1,
                             "samples_done": 0}  # fmt: skip
    event = (0, "ATT", "w1", "tile", state, TileState.LEASED, TileTrigger.LEASE, None, None,
             f"fence {TOKEN}")  # fmt: skip
    attempt = ("ATT", 0, "tile", "w1", TOKEN, 0, True, None, None, None)
    return before | {"tile": tile, "events": [*before["events"], event],
                     "attempts": [*before["attempts"], attempt]}  # fmt: skip


@pytest.mark.parametrize("tile_state", list(TileState), ids=str)
async def test_each_fence_case_goes_to_its_owner(
    db: Recording, new_job: Factory, tile_state: TileState
) -> None:
    taken = 0
    for job_state, cancel, fence, attempts in itertools.product(
        list(JobState), [False, True], [0, TOKEN - 1, TOKEN], [0, 1]
    ):
        owned, dispatched = await _job(db, new_job), await _job(db, new_job)
        for job_id in (owned, dispatched):
            await _force(db, job_id, tile=tile_state, fence=fence, attempts=attempts,
                         job=job_state, cancel=cancel)  # fmt: skip
        case = (job_state, cancel, fence, attempts)
        seen = await db.get_tile(owned, 0)
        assert seen is not None
        before = await _rows(db, owned)
        lease = _lease(owned)
        fast = await _statement_fence(db, lease, seen)
        if fast:
            taken += 1
            assert await _rows(db, owned) == _fenced_rows(before, tile_state), case
            # and never a case the transaction would refuse
            twin = await _job(db, new_job)
            await _force(db, twin, tile=tile_state, fence=fence, attempts=attempts,
                         job=job_state, cancel=cancel)  # fmt: skip
            slow = await db._tx("fence", lambda c: fencing.fence(c, _lease(twin)))  # noqa: B023
            assert slow is True, f"the statement fenced what the transaction refuses: {case}"
            assert await _rows(db, twin) == await _rows(db, owned), case
            expected: bool = True
        else:
            assert await _rows(db, owned) == before, f"declined but wrote: {case}"
            expected = await db._tx("fence", lambda c: fencing.fence(c, lease))  # noqa: B023
        assert await _fence(db, dispatched) is expected, case
        owner = ["statement fence_first"] if fast else ["statement fence_first", "tx fence_tile"]
        assert db.ran == owner, case
        assert await _rows(db, dispatched) == await _rows(db, owned), case
    if TileTrigger.LEASE in tile_legal_events(tile_state):
        # the common case: never leased, job progressing, no cancel, fence below the token
        assert taken == 2, f"{tile_state}: the two never-leased cases below the token"
    else:
        assert taken == 0


async def test_a_superseded_message_never_fences_and_fence_tile_is_the_transaction(
    db: Recording, new_job: Factory
) -> None:
    job_id = await _job(db, new_job)
    await _force(db, job_id, tile=TileState.QUEUED, fence=0, attempts=0,
                 job=JobState.PROGRESSING, cancel=False)  # fmt: skip
    bump = "UPDATE tiles SET generation = 2 WHERE job_id = $1 AND tile_index = 0"
    await db._tx("bump", lambda c: c.execute(bump, job_id))
    seen = await db.get_tile(job_id, 0)
    assert seen is not None
    lease = _lease(job_id)
    older = await db._statement("f", lambda c: fastpath.fence(c, lease, 1))
    assert older is not None and not older.fenced and older.tile == seen
    assert await db.get_tile(job_id, 0) == seen, "declined: nothing written"
    assert await _statement_fence(db, lease, seen), "the message of the row's generation fences"
    db.ran.clear()
    assert not await db.fence_tile(job_id, 0, token=TOKEN, attempt_id="b", node="w")
    assert db.ran == ["tx fence_tile"]


async def test_the_transaction_moves_the_job_the_statement_does_not(
    db: Recording, new_job: Factory
) -> None:
    movers = [s for s in JobState if s not in fastpath.quiet_job_states(JobTrigger.TILE_STARTED)]
    for job_state in movers:
        job_id = await _job(db, new_job)
        await _force(db, job_id, tile=TileState.QUEUED, fence=0, attempts=0,
                     job=job_state, cancel=False)  # fmt: skip
        seen = await db.get_tile(job_id, 0)
        assert seen is not None
        lease = _lease(job_id)
        assert not await _statement_fence(db, lease, seen)
        moved = await db._tx("f", lambda c: fencing.fence(c, lease))  # noqa: B023
        job = await db.get_job(job_id)
        assert job is not None
        if moved:
            assert job.state is JobState.PROGRESSING, job_state
            job_rows = [e for e in await db.job_events(job_id) if e.entity == "job"]
            assert (job_rows[-1].from_state, job_rows[-1].trigger) == (
                job_state,
                JobTrigger.TILE_STARTED,
            )
        else:
            assert job.state is job_state


async def test_the_transaction_names_the_attempts_a_takeover_supersedes(
    db: Recording, new_job: Factory
) -> None:
    job_id = await _job(db, new_job)
    assert await db.fence_tile(job_id, 0, token=1, attempt_id="old", node="w0")
    closed = await _job(db, new_job)
    assert await db.fence_tile(closed, 0, token=1, attempt_id="gone", node="w0")
    await db.end_attempt("gone", outcome="lease_lost")
    for jid, error in ((job_id, "took over from attempt old on w0"), (closed, None)):
        seen = await db.get_tile(jid, 0)
        assert seen is not None and seen.attempt_count == 1
        lease = TileFence(jid, 0, 2, f"new-{jid}", "w1")
        assert not await _statement_fence(db, lease, seen)
        assert await db.fence_tile(jid, 0, token=2, attempt_id=lease.attempt_id, node="w1")
        tile = await db.get_tile(jid, 0)
        assert tile is not None and tile.lease_fence == 2 and tile.attempt_count == 2
        last = (await db.job_events(jid))[-1]
        assert (last.trigger, last.attempt_id, last.detail) == (
            "lease",
            lease.attempt_id,
            "fence 2",
        )
        if error is None:
            assert (last.error_code, tile.last_error_code) == (None, None)
        else:
            assert last.error_code == tile.last_error_code == ABANDONED
            assert last.error is not None and last.error.startswith(error)
            assert tile.last_error == last.error
            old = [a for a in await db.attempts(jid) if a.attempt_id == "old"]
            assert old[0].ended_at is None, "left open for a frozen owner to record its outcome"


def _commit(job_id: str, inline: bool) -> TileCommit:
    return TileCommit(
        job_id,
        0,
        token=TOKEN,
        attempt_id=f"att-{job_id}",
        result_key=None if inline else "tiles/x/0/abc.npy",
        result_sha256="abc",
        result_data=b"npy bytes" if inline else None,
        samples_done=16,
        node="w1",
    )


@pytest.mark.parametrize("tile_state", list(TileState), ids=str)
@pytest.mark.parametrize("inline", [False, True], ids=["object", "inline"])
async def test_each_commit_case_goes_to_its_owner(
    db: Recording, new_job: Factory, tile_state: TileState, inline: bool
) -> None:
    taken = 0
    taken_in: set[JobState] = set()
    for job_state, fence in itertools.product(list(JobState), [TOKEN - 1, TOKEN]):
        jobs = [await _job(db, new_job), await _job(db, new_job)]
        for job_id in jobs:
            assert await db.fence_tile(job_id, 0, token=TOKEN, attempt_id=f"att-{job_id}",
                                       node="w1")  # fmt: skip
            await _force(db, job_id, tile=tile_state, fence=fence, attempts=1,
                         job=job_state, cancel=False)  # fmt: skip
        owned, dispatched = jobs
        before = await _rows(db, owned)
        done = _commit(owned, inline)
        fast = await db._statement("commit", lambda c: fastpath.commit(c, done))  # noqa: B023
        case = (job_state, fence)
        if fast:
            taken += 1
            taken_in.add(job_state)
            rows = await _rows(db, owned)
            assert rows["tile"] == before["tile"] | {
                "state": TileState.DONE,
                "result_key": done.result_key,
                "result_sha256": "abc",
                "samples_done": 16,
                "last_error_code": None,
                "last_error": None,
            }, case
            event = (0, "ATT", "w1", "tile", tile_state, TileState.DONE, TileTrigger.COMMIT,
                     None, None, None)  # fmt: skip
            assert rows["events"] == [*before["events"], event], case
            assert [a[6:8] for a in rows["attempts"]] == [(False, "done")], case
            assert rows["job"] == before["job"], case
            assert rows["inline"] == ({0: ("abc", b"npy bytes")} if inline else {})
            expected = CommitOutcome.COMMITTED
        else:
            assert await _rows(db, owned) == before, f"declined but wrote: {case}"
            expected = await db._tx("commit", lambda c: fencing.commit(c, done))  # noqa: B023
        db.ran.clear()
        assert await db.commit_tile(_commit(dispatched, inline)) is expected, case
        owner = ["statement commit_tile"] if fast else ["statement commit_tile", "tx commit_tile"]
        assert db.ran == owner, case
        assert await _rows(db, dispatched) == await _rows(db, owned), case
    if tile_state in (TileState.LEASED, TileState.PROGRESSING):
        # its job progressing, or paused while the tile was in flight (the commit lands)
        assert taken == 2, "the tile leased under this token, its job progressing or paused"
        assert taken_in == {JobState.PROGRESSING, JobState.PAUSED}
    else:
        assert taken == 0


async def test_commit_needs_exactly_one_of_key_and_data(
    store: MetadataStore, new_job: Factory
) -> None:
    job_id = await _job(store, new_job)
    assert await store.fence_tile(job_id, 0, token=TOKEN, attempt_id="a", node="w")
    for key, data in (("tiles/k", b"d"), (None, None)):
        with pytest.raises(ValidationError, match="exactly one"):
            done = TileCommit(
                job_id,
                0,
                token=TOKEN,
                attempt_id="a",
                result_key=key,
                result_data=data,
                result_sha256="s",
                samples_done=1,
                node="w",
            )
            await store.commit_tile(done)


def test_fast_paths_cover_only_quiet_job_states() -> None:
    assert fastpath.quiet_job_states(JobTrigger.TILE_STARTED) == ["progressing"]
    assert fastpath.quiet_job_states(JobTrigger.TILE_PROGRESS) == ["progressing", "paused"]
