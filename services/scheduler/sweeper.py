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

from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from services.scheduler.planner import publish_tiles
from shared.errors import RetryableError
from shared.jetstream import retry_transient
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
        self.republished = 0

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
        """One pass; returns the tiles it re-published."""
        age = self.rt.settings.tuning.sweep_age
        stale = await self.rt.db.stale_tiles(older_than=age, limit=1000)
        lost = [t for t in stale if not await self._accounted_for(t)]
        if lost:
            await publish_tiles(self.rt, lost, bump=True)
            self.republished += len(lost)
            self.rt.metrics.republished.inc(len(lost))
            for t in lost:
                self.log.warning(
                    "re-published lost tile",
                    job_id=t.job_id,
                    tile=t.tile_index,
                    generation=t.generation + 1,
                )
        return lost

    async def _accounted_for(self, tile: Tile) -> bool:
        """True if someone holds the tile's lease or a message for it is in the stream."""
        key = n.lease_key_tile(tile.job_id, tile.tile_index)
        if await self.rt.leases.holder(key) is not None:
            return True
        subject = self.rt.names.tile_subject(tile.job_id, tile.tile_index)

        async def attempt(budget: float) -> object:
            return await asyncio.wait_for(self.rt.js.get_last_msg(self.stream, subject), budget)

        try:  # a leader election answers 503 or nothing for seconds: retry, bounded
            await retry_transient(f"read {self.stream}", attempt, timeout_total=READ_TIMEOUT)
        except StreamMsgNotFound:
            return False
        return True
