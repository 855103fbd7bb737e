"""The deadline check: jobs past their deadline end ``failed_terminal`` (``deadline_exceeded``).

The scheduler reads the live jobs whose ``deadline_at`` has passed (the partial index
``jobs_deadline``, earliest first, a bounded page), fails each (below), then sleeps until the
earliest deadline of a live job (:meth:`~shared.metadata.MetadataStore.next_deadline`, by the
database's clock): at least ``TESSERA_DEADLINE_INTERVAL`` (default 1 s), at most
:data:`IDLE_WAIT`. Planning a job wakes it (:meth:`Deadlines.nudge`: the new job may have the
earliest deadline), so a deadline is enforced within the interval of its time; a job planned
by another scheduler that died before its check is found within :data:`IDLE_WAIT`. (It used to
read the overdue jobs every interval: one query a second of the scheduler and PostgreSQL with
no deadline anywhere, 2.3 core-ms/s of the idle stack's 16.) It fails each through
:func:`~shared.service.announce.fail_job`: the job moves by ``terminal_failure`` with code
``deadline_exceeded`` and a ``job-failed`` event tells watchers and the workers, whose tiles of
it stop at their next pass boundary (they also read the job's row at every checkpoint). A job
that completed or was cancelled meanwhile is left alone (the move is illegal then); several
schedulers failing the same job is harmless (one move wins, the event's id absorbs the repeat).
"""

from __future__ import annotations

import asyncio

from shared.core.errors import RetryableError
from shared.core.lifecycle import JobTrigger
from shared.service.announce import fail_job
from shared.service.runtime import Runtime

__all__ = ["DEADLINE_CODE", "DEADLINE_PAGE", "IDLE_WAIT", "Deadlines"]

DEADLINE_CODE = "deadline_exceeded"
DEADLINE_PAGE = 100
IDLE_WAIT = 30.0
"""The longest sleep of the check (no deadline, or a far one): the net for a job whose planning
woke another scheduler."""


class Deadlines:
    """Fails overdue jobs at their deadline (checked at least ``interval`` seconds apart)."""

    def __init__(
        self, rt: Runtime, *, interval: float | None = None, idle_wait: float = IDLE_WAIT
    ) -> None:
        self.rt = rt
        self.interval = rt.settings.scheduler.deadline_interval if interval is None else interval
        self.idle_wait = max(idle_wait, self.interval)
        self.log = rt.log.bind(component="deadlines")
        self._nudged = asyncio.Event()

    def nudge(self) -> None:
        """Check now (a job was planned: its deadline may be the earliest)."""
        self._nudged.set()

    def next_wait(self, until: float | None) -> float:
        """The sleep before the next check, ``until`` the earliest deadline (None: none)."""
        if until is None:
            return self.idle_wait
        return min(self.idle_wait, max(self.interval, until))

    async def check_once(self) -> list[str]:
        """One round: fail every overdue job (page by page); the ids failed."""
        failed: list[str] = []
        while True:
            overdue = await self.rt.db.overdue_jobs(limit=DEADLINE_PAGE)
            for job_id in overdue:
                job = await fail_job(
                    self.rt, job_id, JobTrigger.TERMINAL_FAILURE, code=DEADLINE_CODE,
                    error="the job's deadline passed before it completed", log=self.log,
                )  # fmt: skip
                if job is not None:
                    failed.append(job_id)
            if len(overdue) < DEADLINE_PAGE:
                return failed

    async def run(self, stop: asyncio.Event) -> None:
        """Check, sleep until the next deadline or a nudge, until ``stop``; a failed round is
        logged and retried after ``interval``."""
        while not stop.is_set():
            self._nudged.clear()  # (before the reads: a job planned after them nudges again)
            wait = self.interval
            try:
                await self.check_once()
                wait = self.next_wait(await self.rt.db.next_deadline())
            except RetryableError as exc:
                self.log.warning("deadline check failed this round", error=str(exc))
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._nudged.wait())]
            try:
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
