"""The finalizer's "is every tile of this job done?", one query for the events that arrive together.

Each tile-done event needs an answer from a query that *started after the event arrived*: the
event is published after its tile's commit, so such a query sees that commit (and a query
already running when the event came may have started before it). :class:`ReadyProbe` runs one
query per job at a time; every event of the job that arrived before a query started shares
that query's answer, and the events that arrive while it runs share the next one. Tile-done
events of one job come in bursts (a fetch brings several), so the burst costs one or two
queries instead of one each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["ReadyProbe"]


@dataclass
class _Job:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    asked: int = 0  # tickets handed out
    answered: int = 0  # every ticket up to this one has its answer in ``ready``
    ready: bool = False
    waiting: int = 0  # callers inside :meth:`ReadyProbe.ready` (0: the entry is dropped)


class ReadyProbe:
    """Coalesces the ``all_done(job_id)`` queries of concurrent callers, per job."""

    def __init__(self, all_done: Callable[[str], Awaitable[bool]]) -> None:
        self._all_done = all_done
        self._jobs: dict[str, _Job] = {}
        #: queries actually run (the tests count them)
        self.queries = 0

    async def ready(self, job_id: str) -> bool:
        """Whether every tile of ``job_id`` is done, by a query started after this call."""
        job = self._jobs.setdefault(job_id, _Job())
        job.asked += 1
        ticket = job.asked
        job.waiting += 1
        try:
            async with job.lock:
                if job.answered >= ticket:  # a query that started after our call answered
                    return job.ready
                upto = job.asked  # every caller so far called before this query starts
                self.queries += 1
                ready = await self._all_done(job_id)
                job.answered, job.ready = upto, ready
                return ready
        finally:
            job.waiting -= 1
            if job.waiting == 0:
                del self._jobs[job_id]
