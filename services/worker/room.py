"""The worker's ``Room`` messages: the dispatchers' nudge, every few tiles that leave its hand.

A dispatcher runs a round once ``refill`` tiles have finished (docs/architecture.md,
"Scheduler"). It used to hear every tile-done event to count them: one wake-up of the scheduler
per tile, whatever its length. A worker now counts the tiles that leave its hand (settled: done,
failed, handed back) and tells the dispatchers how many in one :class:`~proto.messages.Room`
message on core NATS, once they reach its *spare* tiles (the ones it holds beyond one per
kernel thread) or as soon as it holds no more tiles than threads. So no thread of it waits for a
round because of the count it keeps back: while it holds more tiles than threads, every thread
still has one.
"""

from __future__ import annotations

from nats.aio.client import Client

from proto.messages import Room
from shared.core.errors import StoreUnavailable
from shared.nats.jetstream import publish_unconfirmed
from shared.service.logs import Log

__all__ = ["RoomCount", "RoomNudges"]


class RoomCount:
    """How many tiles left the hand since the last ``Room``, and when to send one (pure)."""

    def __init__(self, *, threads: int, in_hand: int) -> None:
        self.threads = threads
        #: a ``Room`` at the latest after so many tiles (the spare tiles, at least 1)
        self.every = max(1, in_hand - threads)
        self.pending = 0

    def left(self, tiles: int, held: int) -> int:
        """``tiles`` left the hand and ``held`` are still in it: the count to send now (the
        count is then reset), or 0 to keep counting."""
        self.pending += max(1, tiles)
        if self.pending < self.every and held > self.threads:
            return 0
        count, self.pending = self.pending, 0
        return count


class RoomNudges:
    """Sends a worker's ``Room`` messages (unconfirmed: a lost one costs the dispatcher's timer,
    at most its idle interval, as a lost tile-done nudge did)."""

    def __init__(self, nc: Client, subject: str, count: RoomCount, log: Log) -> None:
        self.nc, self.subject, self.count, self.log = nc, subject, count, log

    async def left(self, tiles: int, held: int) -> None:
        """``tiles`` left the hand, ``held`` are still in it."""
        count = self.count.left(tiles, held)
        if not count:
            return
        try:
            await publish_unconfirmed(self.nc, self.subject, Room(count), msg_id=None)
        except StoreUnavailable as exc:
            self.log.debug("room not announced; the dispatcher's timer covers it", error=str(exc))
