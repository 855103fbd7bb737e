"""The deadline check against PostgreSQL: it sleeps until the earliest deadline, not a poll a
second, and a planned job wakes it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from proto.messages import JobMessage
from services.scheduler.__main__ import planning
from services.scheduler.deadlines import Deadlines
from shared.core.lifecycle import JobState
from shared.service.runtime import Runtime
from tests.helpers import eventually
from tests.metadata.conftest import make_new_job


class _Counted:
    """``rt.db`` with its ``overdue_jobs`` and ``next_deadline`` reads counted (once done)."""

    def __init__(self, rt: Runtime) -> None:
        self.reads = self.nexts = 0
        overdue, following = rt.db.overdue_jobs, rt.db.next_deadline

        async def overdue_jobs(*, limit: int = 100) -> list[str]:
            found = await overdue(limit=limit)
            self.reads += 1
            return found

        async def next_deadline() -> float | None:
            until = await following()
            self.nexts += 1
            return until

        rt.db.overdue_jobs = overdue_jobs  # type: ignore[method-assign]
        rt.db.next_deadline = next_deadline  # type: ignore[method-assign]


async def _failed(rt: Runtime, job_id: str) -> bool:
    job = await rt.db.get_job(job_id)
    return job is not None and job.state is JobState.FAILED_TERMINAL


async def _overdue_once_asleep(rt: Runtime, counted: _Counted) -> str:
    """Once the check's first round is over (it sleeps), a job submitted past its deadline."""
    await eventually(lambda: counted.nexts >= 1, what="the first check, asleep after it")
    past = datetime.now(UTC) - timedelta(seconds=1)
    return (await rt.db.submit_job(make_new_job(deadline_at=past))).job.job_id


async def test_the_check_sleeps_until_the_earliest_deadline_and_fails_the_job_at_it(
    runtime: Runtime,
) -> None:
    """With a 0.1 s interval, a poll would read the overdue jobs about 20 times before a
    deadline 2 s away; the check reads them at its start and at the deadline (a third time if
    it woke a hair early), and the job fails no sooner than its deadline."""
    deadline = datetime.now(UTC) + timedelta(seconds=2)
    job_id = (await runtime.db.submit_job(make_new_job(deadline_at=deadline))).job.job_id
    counted = _Counted(runtime)
    stop = asyncio.Event()
    task = asyncio.create_task(Deadlines(runtime, interval=0.1).run(stop))
    try:
        await eventually(lambda: _failed(runtime, job_id), timeout=15, what="the job failed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    job = await runtime.db.get_job(job_id)
    assert job is not None and job.last_error_code == "deadline_exceeded"
    assert job.finished_at is not None and job.finished_at >= deadline
    assert counted.reads <= 4, counted.reads


async def test_a_nudge_wakes_the_sleeping_check(runtime: Runtime) -> None:
    """No deadline anywhere: the check sleeps its idle wait (60 s here). A job then submitted
    past its deadline fails at once when the planner's nudge comes, not after the sleep."""
    counted = _Counted(runtime)
    deadlines = Deadlines(runtime, interval=0.1, idle_wait=60.0)
    assert deadlines.next_wait(None) == 60.0
    stop = asyncio.Event()
    task = asyncio.create_task(deadlines.run(stop))
    try:
        job_id = await _overdue_once_asleep(runtime, counted)
        assert not await _failed(runtime, job_id)
        deadlines.nudge()
        await eventually(lambda: _failed(runtime, job_id), timeout=10, what="the job failed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert counted.reads == 2


async def test_the_scheduler_wires_a_plan_to_wake_the_check(runtime: Runtime) -> None:
    """As the scheduler runs them: planning a job whose deadline has passed fails it at once,
    not after the check's idle sleep (30 s)."""
    planner, _, deadlines = planning(runtime)
    counted = _Counted(runtime)
    stop = asyncio.Event()
    task = asyncio.create_task(deadlines.run(stop))
    try:
        job_id = await _overdue_once_asleep(runtime, counted)
        await planner.plan(JobMessage(job_id, 0))
        await eventually(lambda: _failed(runtime, job_id), timeout=10, what="the job failed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def test_the_wait_is_the_time_to_the_deadline_within_the_interval_and_the_idle_wait(
    runtime: Runtime,
) -> None:
    deadlines = Deadlines(runtime, interval=1.0, idle_wait=30.0)
    assert [deadlines.next_wait(u) for u in (None, -5.0, 0.2, 7.5, 400.0)] == [
        30.0, 1.0, 1.0, 7.5, 30.0,
    ]  # fmt: skip
    assert Deadlines(runtime, interval=40.0, idle_wait=30.0).idle_wait == 40.0
