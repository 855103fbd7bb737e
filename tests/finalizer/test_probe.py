"""The finalizer's coalesced "every tile done?": one query per burst, never a stale answer."""

from __future__ import annotations

import asyncio

from services.finalizer.probe import ReadyProbe
from tests.helpers import eventually


class Db:
    """``all_done`` that answers ``done`` as of the moment the query starts, after a gate."""

    def __init__(self) -> None:
        self.done = False
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def all_done(self, job_id: str) -> bool:
        seen = self.done  # the query's snapshot is taken when it starts
        self.started.set()
        await self.gate.wait()
        return seen


async def test_callers_that_arrive_during_a_query_share_the_next_one() -> None:
    db = Db()
    probe = ReadyProbe(db.all_done)
    first = asyncio.create_task(probe.ready("j"))
    await asyncio.wait_for(db.started.wait(), 5)  # the first query started, not done yet
    db.done = True  # the last tile commits; its event (and others) arrive during the query
    later = [asyncio.create_task(probe.ready("j")) for _ in range(5)]
    await eventually(lambda: probe._jobs["j"].asked == 6, timeout=5, what="six callers")
    db.gate.set()
    assert await first is False
    assert await asyncio.gather(*later) == [True] * 5, "answered by a query started after them"
    assert probe.queries == 2, "six callers, two queries"
    assert not probe._jobs, "nothing kept once nobody waits"


async def test_jobs_are_probed_apart_and_a_failed_query_is_not_an_answer() -> None:
    calls: list[str] = []

    async def all_done(job_id: str) -> bool:
        calls.append(job_id)
        if len(calls) == 1:
            raise RuntimeError("store down")
        return job_id == "b"

    probe = ReadyProbe(all_done)
    failed, a, b = await asyncio.gather(
        probe.ready("a"), probe.ready("a"), probe.ready("b"), return_exceptions=True
    )
    assert isinstance(failed, RuntimeError)
    assert (a, b) == (False, True), "the waiter of the failed query asked again"
    assert sorted(calls) == ["a", "a", "b"]
