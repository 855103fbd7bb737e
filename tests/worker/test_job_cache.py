"""The worker's job cache (:class:`services.worker.context.JobCache`) on the metadata double."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.context import JobCache
from shared.core.errors import StoreUnavailable
from shared.metadata import Job
from tests.doubles.metadata import MemoryMetadata
from tests.helpers import eventually
from tests.metadata.conftest import make_new_job


class GatedReads(MemoryMetadata):
    """Job reads that wait for ``open`` (so several can be asked for at once), counted."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.open = asyncio.Event()
        self.error: Exception | None = None

    async def get_job(self, job_id: str) -> Job | None:
        self.reads += 1
        await self.open.wait()
        if self.error is not None:
            raise self.error
        return await super().get_job(job_id)


async def test_tiles_that_start_together_share_one_read_of_their_new_job() -> None:
    db = GatedReads()
    job = (await db.submit_job(make_new_job())).job
    cache = JobCache(db, 8)
    eight = [asyncio.create_task(cache.get(job.job_id)) for _ in range(8)]
    await eventually(lambda: db.reads >= 1, timeout=5, what="a read on its way")
    db.open.set()
    rows = await asyncio.wait_for(asyncio.gather(*eight), 5)
    assert db.reads == 1 and {r.job_id for r in rows if r is not None} == {job.job_id}
    assert await cache.get(job.job_id) == rows[0] and db.reads == 1, "then cached"


async def test_a_failed_shared_read_fails_every_caller_and_the_next_reads_again() -> None:
    db = GatedReads()
    job = (await db.submit_job(make_new_job())).job
    cache = JobCache(db, 8)
    db.error = StoreUnavailable("the database went away")
    two = [asyncio.create_task(cache.get(job.job_id)) for _ in range(2)]
    await eventually(lambda: db.reads >= 1, timeout=5, what="a read on its way")
    db.open.set()
    for task in two:
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(task, 5)
    db.error = None
    assert await cache.get(job.job_id) is not None and db.reads == 2


async def test_a_caller_cancelled_while_it_waits_leaves_the_read_to_the_others() -> None:
    db = GatedReads()
    job = (await db.submit_job(make_new_job())).job
    cache = JobCache(db, 8)
    gone, stays = (asyncio.create_task(cache.get(job.job_id)) for _ in range(2))
    await eventually(lambda: db.reads >= 1, timeout=5, what="a read on its way")
    gone.cancel()
    db.open.set()
    row = await asyncio.wait_for(stays, 5)
    assert row is not None and row.job_id == job.job_id and db.reads == 1
