"""The deadline check: jobs past their deadline end ``failed_terminal`` (``deadline_exceeded``).

Every ``TESSERA_DEADLINE_INTERVAL`` seconds (default 1) the scheduler reads the live jobs whose
``deadline_at`` has passed (the partial index ``jobs_deadline``, earliest first, a bounded page)
and fails each through :func:`~shared.service.announce.fail_job`: the job moves by
``terminal_failure`` with code ``deadline_exceeded`` and a ``job-failed`` event tells watchers
and the workers, whose tiles of it stop at their next pass boundary (they also read the job's
row at every checkpoint). A job that completed or was cancelled meanwhile is left alone (the
move is illegal then); several schedulers failing the same job is harmless (one move wins, the
event's id absorbs the repeat).
"""

from __future__ import annotations

import asyncio
import contextlib

from shared.core.errors import RetryableError
from shared.core.lifecycle import JobTrigger
from shared.service.announce import fail_job
from shared.service.runtime import Runtime

__all__ = ["DEADLINE_CODE", "DEADLINE_PAGE", "Deadlines"]

DEADLINE_CODE = "deadline_exceeded"
DEADLINE_PAGE = 100


class Deadlines:
    """Fails overdue jobs, every ``interval`` seconds."""

    def __init__(self, rt: Runtime, *, interval: float | None = None) -> None:
        self.rt = rt
        self.interval = rt.settings.scheduler.deadline_interval if interval is None else interval
        self.log = rt.log.bind(component="deadlines")

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
        """Check every ``interval`` until ``stop``; a failed round is logged and retried."""
        while not stop.is_set():
            try:
                await self.check_once()
            except RetryableError as exc:
                self.log.warning("deadline check failed this round", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
