"""Group commit against the real PostgreSQL: a batch statement decides each tile as if alone.

The owner's statements (:mod:`shared.metadata.fastpath`) take their tiles as arrays, and the
store sends the calls of a worker's tiles that arrive together as one statement
(:mod:`shared.metadata.coalesce`). For a mix of cases in one batch — every tile state, live,
paused and final jobs, cancel flags, fences, earlier attempts, a missing tile — each tile's
answer and rows must equal what the statement writes for that tile alone, on a twin job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from shared.core.errors import NotFoundError
from shared.core.lifecycle import JobState, JobTrigger, TileState, TileTrigger, tile_legal_events
from shared.metadata import MetadataStore, TileCommit, TileFence, fastpath, tiles
from shared.metadata.audit import Conn
from tests.metadata.test_fastpath import TOKEN, Factory, _force, _job, _lease, _rows

T = TypeVar("T")
JOB_STATES = [JobState.PROGRESSING, JobState.RUNNING, JobState.PAUSED, JobState.CANCELLED]


class Counting(MetadataStore):
    """The real store, counting the statements and reads it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    async def _statement(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T | None:
        self.sent.append(what)
        return await super()._statement(what, fn)

    async def _read(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        self.sent.append(what)
        return await super()._read(what, fn)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Counting]:
    opened = await Counting.connect(database_url, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


async def _twins(db: MetadataStore, new_job: Factory, **case: Any) -> tuple[str, str]:
    pair = await _job(db, new_job), await _job(db, new_job)
    for job_id in pair:
        await _force(db, job_id, **case)
    return pair


def _same(tile: Any, twin: Any) -> bool:
    """Equal tile rows but for the job and the clocks."""
    if tile is None or twin is None:
        return tile is twin
    skip = ("job_id", "updated_at", "published_at")
    a, b = dataclasses.asdict(tile), dataclasses.asdict(twin)
    return all(a[k] == b[k] for k in a if k not in skip)


async def test_a_fence_batch_decides_each_tile_as_if_alone(db: Counting, new_job: Factory) -> None:
    cases = list(itertools.product(list(TileState), JOB_STATES, [False, True], [0, TOKEN], [0, 1]))
    pairs = [
        await _twins(db, new_job, tile=t, job=j, cancel=c, fence=f, attempts=a)
        for t, j, c, f, a in cases
    ]
    calls: list[tuple[TileFence, int]] = []
    for batched, _ in pairs:
        seen = await db.get_tile(batched, 0)
        assert seen is not None
        calls.append((_lease(batched), seen.generation))
    missing = (dataclasses.replace(_lease(pairs[0][0]), tile_index=99), 0)
    batch = await db._statement("batch", lambda c: fastpath.fence_many(c, [*calls, missing]))
    assert batch is not None and len(batch) == len(calls) + 1
    assert batch[-1].fenced is False and batch[-1].tile is None
    fenced = 0
    for case, (batched, alone), (_, generation), got in zip(
        cases, pairs, calls, batch[:-1], strict=True
    ):
        one = await db._statement("one", lambda c: fastpath.fence(c, _lease(alone), generation))  # noqa: B023
        assert one is not None
        assert (got.fenced, _same(got.tile, one.tile)) == (one.fenced, True), case
        assert await _rows(db, batched) == await _rows(db, alone), case
        fenced += got.fenced
    leasable = sum(TileTrigger.LEASE in tile_legal_events(t) for t in TileState)
    assert fenced == leasable, "the plain cases: never leased, progressing job, no cancel"


def _commit(job_id: str, *, inline: bool) -> TileCommit:
    data = b"pixels" if inline else None
    key = None if inline else "tiles/j/0/abc.npy"
    return TileCommit(job_id, 0, token=TOKEN, attempt_id=f"att-{job_id}", result_key=key,
                      result_sha256="abc", result_data=data, samples_done=4, node="w1")  # fmt: skip


async def test_a_commit_batch_decides_each_tile_as_if_alone(db: Counting, new_job: Factory) -> None:
    cases = list(itertools.product(list(TileState), JOB_STATES, [TOKEN - 1, TOKEN], [False, True]))
    pairs = [
        await _twins(db, new_job, tile=t, job=j, cancel=False, fence=f, attempts=1)
        for t, j, f, _ in cases
    ]
    dones = [
        _commit(batched, inline=inline)
        for (batched, _), (*_, inline) in zip(pairs, cases, strict=True)
    ]
    batch = await db._statement("batch", lambda c: fastpath.commit_many(c, dones))
    assert batch is not None and len(batch) == len(dones)
    committed = 0
    for case, (batched, alone), got in zip(cases, pairs, batch, strict=True):
        one = await db._statement(
            "one",
            lambda c: fastpath.commit(c, _commit(alone, inline=case[-1])),  # noqa: B023
        )
        assert got == one, case
        assert await _rows(db, batched) == await _rows(db, alone), case
        committed += bool(got)
    committable = sum(TileTrigger.COMMIT in tile_legal_events(t) for t in TileState)
    quiet = set(fastpath.quiet_job_states(JobTrigger.TILE_PROGRESS)) & set(JOB_STATES)
    assert committed == committable * len(quiet) * 2, "under the fence, object or inline"


async def test_one_read_answers_the_completion_of_many_jobs(db: Counting, new_job: Factory) -> None:
    open_job = await _job(db, new_job)
    done_job = await _job(db, new_job)
    await db._tx(
        "done",
        lambda c: c.execute(
            "UPDATE tiles SET state = 'done', lease_fence = tile_index + 7 WHERE job_id = $1",
            done_job,
        ),
    )
    unplanned = (await db.submit_job(new_job())).job.job_id
    names = [open_job, done_job, unplanned, done_job, "nope"]
    answers = await db._read("many", lambda c: tiles.completed_by_many(c, names))
    assert answers[:4] == [None, 10, None, 10], "the newest fence names the completion"
    assert isinstance(answers[4], NotFoundError)
    with pytest.raises(NotFoundError):
        await db.completed_by("nope")


async def test_the_store_sends_calls_that_arrive_together_as_one_statement(
    db: Counting, new_job: Factory
) -> None:
    job_id = await _job(db, new_job)
    await _force(db, job_id, tile=TileState.QUEUED, job=JobState.PROGRESSING, cancel=False,
                 fence=0, attempts=0)  # fmt: skip
    await db._tx("queued", lambda c: c.execute("UPDATE tiles SET state = 'queued'"
                                               " WHERE job_id = $1", job_id))  # fmt: skip
    indexes = range(4)
    db.sent.clear()
    firsts = await asyncio.gather(*(
        db.fence_first(job_id, i, token=TOKEN + i, attempt_id=f"a{i}", node="w1", generation=0)
        for i in indexes
    ))  # fmt: skip
    assert [f.fenced for f in firsts] == [True] * 4
    assert db.sent == ["fence_first"], "four fences, one statement"
    dones = [
        TileCommit(job_id, i, token=TOKEN + i, attempt_id=f"a{i}", result_key=None,
                   result_sha256=f"s{i}", result_data=b"x", samples_done=4, node="w1")
        for i in indexes
    ]  # fmt: skip
    db.sent.clear()
    outcomes = await asyncio.gather(*(db.commit_tile(d) for d in dones))
    assert {o.value for o in outcomes} == {"committed"}
    assert db.sent == ["commit_tile"], "four commits, one statement"
    db.sent.clear()
    completions = await asyncio.gather(*(db.completed_by(job_id) for _ in indexes))
    assert completions == [TOKEN + 3] * 4
    assert db.sent == ["completed_by"]
    results = await db.tile_results(job_id)
    assert sorted(results) == list(indexes)
