"""The sweeper: re-publish tiles whose message was lost.

The broker is not the source of truth (see docs/architecture.md): a stale owner's late ack can
acknowledge a redelivered message, and acks can be lost in a leader election, so a tile can be
not done while no message for it exists. Every ``sweep_interval`` the sweeper asks PostgreSQL for
tiles of active jobs that are not done and were last published more than ``sweep_age`` ago, and
re-publishes those with **no live lease and no message in the TILES stream**, under a new
generation in their ``Nats-Msg-Id`` (the old id may still sit in the duplicate window).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from proto.messages import JobMessage
from services.scheduler.planner import publish_tiles
from shared.errors import RetryableError
from shared.jetstream import publish, retry_transient
from shared.metadata import Tile
from shared.runtime import Runtime

__all__ = ["Sweeper"]

READ_TIMEOUT = 15.0
"""Bound on one stream read: longer than a leader election (a few seconds, NATS-NOTES)."""


class Sweeper:
    """Finds and re-publishes lost tiles."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="sweeper")
        self.stream = rt.names.stream(n.STREAM_TILES)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``sweep_interval`` until ``stop``."""
        interval = self.rt.settings.tuning.sweep_interval
        while not stop.is_set():
            try:
                await self.sweep_once()
            except RetryableError as exc:
                self.log.warning("sweep failed; next round will retry", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def sweep_once(self) -> list[Tile]:
        """One pass; returns the tiles it re-published (lost jobs are re-published too)."""
        age = self.rt.settings.tuning.sweep_age
        await self._republish_lost_jobs(age)
        stale = await self.rt.db.stale_tiles(older_than=age, limit=1000)
        lost = [t for t in stale if not await self._accounted_for(t)]
        if lost:
            await publish_tiles(self.rt, lost, bump=True)
            self.rt.metrics.republished.inc(len(lost))
            for t in lost:
                self.log.warning(
                    "re-published lost tile",
                    job_id=t.job_id,
                    tile=t.tile_index,
                    generation=t.generation + 1,
                )
        return lost

    async def _republish_lost_jobs(self, age: float) -> None:
        """Re-publish the JOBS message of jobs that sat queued and unplanned for ``age`` s.

        Only when no message for the job is in JOBS; the copy gets a fresh id, since the lost
        one's may still be in the duplicate window. A planner given a copy of a planned job
        finds the plan and stops.
        """
        jobs_stream = self.rt.names.stream(n.STREAM_JOBS)
        for job in await self.rt.db.stale_queued_jobs(older_than=age):
            if await self._in_stream(jobs_stream, self.rt.names.job_subject(job.job_id)):
                continue  # waiting for the planner, not lost
            await publish(
                self.rt.js,
                self.rt.names.job_subject(job.job_id),
                JobMessage(job.job_id, job.generation),
                msg_id=n.swept_job_msg_id(job.job_id, job.generation, int(time.time())),
            )
            self.log.warning("re-published a lost job", job_id=job.job_id)

    async def _accounted_for(self, tile: Tile) -> bool:
        """True if someone holds the tile's lease or a message for it is in the stream."""
        key = n.lease_key_tile(tile.job_id, tile.tile_index)
        if await self.rt.leases.holder(key) is not None:
            return True
        return await self._in_stream(
            self.stream, self.rt.names.tile_subject(tile.job_id, tile.tile_index)
        )

    async def _in_stream(self, stream: str, subject: str) -> bool:
        """True if a message on ``subject`` is still in ``stream`` (pending or in delivery)."""

        async def attempt(budget: float) -> object:
            return await asyncio.wait_for(self.rt.js.get_last_msg(stream, subject), budget)

        try:  # a leader election answers 503 or nothing for seconds: retry, bounded
            await retry_transient(f"read {stream}", attempt, timeout_total=READ_TIMEOUT)
        except StreamMsgNotFound:
            return False
        return True
