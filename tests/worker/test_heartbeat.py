"""The heartbeat stops for good even when a cancel is swallowed inside a renew.

On Python 3.11 ``asyncio.wait_for`` (used by the NATS client for every request) can swallow a
cancellation that arrives as its request completes; a real server cannot be made to hit that
window on demand, so this is the one place a fake lease store is used: its renew swallows the
first cancel exactly as that race does. (The heartbeat against real NATS is exercised by every
end-to-end and chaos test.)
"""

from __future__ import annotations

import asyncio
import dataclasses

from shared.nats.leases import Lease, LeaseOwner
from shared.service.heartbeat import Heartbeat
from shared.service.logs import Log
from tests.doubles.delivery import FakeDelivery


class SwallowingLeases:
    """``renew`` that eats the first cancel (as the wait_for race does) and counts calls."""

    def __init__(self) -> None:
        self.renews = 0
        self.swallowed = 0
        self.in_renew = asyncio.Event()

    async def renew(self, lease: Lease) -> Lease:
        self.renews += 1
        self.in_renew.set()
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if self.swallowed:
                raise
            self.swallowed += 1  # the reply "arrived" as the cancel did: the cancel is lost
        return dataclasses.replace(lease, revision=lease.revision + 1)


async def test_stop_survives_a_swallowed_cancel_and_no_renew_follows() -> None:
    lease = Lease("tile.j.0", token=1, revision=1, owner=LeaseOwner("n", "a"), ttl=2)
    leases = SwallowingLeases()
    beat = Heartbeat(leases, lease, None, 0.01, Log("test")).start()
    await asyncio.wait_for(leases.in_renew.wait(), 5)
    stopped = await asyncio.wait_for(beat.stop(), 5)  # bounded: a lost cancel must not hang it
    assert leases.swallowed == 1
    assert stopped.revision == 2, "the renew that landed is the release's CAS base"
    renews = leases.renews
    await asyncio.sleep(0.1)  # ten heartbeat intervals
    assert leases.renews == renews, "the heartbeat renewed after stop()"


async def test_a_heartbeat_stopped_before_its_first_renew_never_starts_a_task() -> None:
    lease = Lease("tile.j.0", token=1, revision=1, owner=LeaseOwner("n", "a"), ttl=2)
    leases = SwallowingLeases()
    beat = Heartbeat(leases, lease, None, 0.05, Log("test")).start()
    assert await asyncio.wait_for(beat.stop(), 5) is lease
    await asyncio.sleep(0.15)  # three intervals: nothing may renew after stop()
    assert leases.renews == 0 and beat._task is None


async def test_renews_come_one_interval_apart_from_the_first() -> None:
    lease = Lease("tile.j.0", token=1, revision=1, owner=LeaseOwner("n", "a"), ttl=2)
    leases = CountingLeases()
    beat = Heartbeat(leases, lease, None, 0.02, Log("test")).start()
    await asyncio.wait_for(leases.third.wait(), 5)
    await beat.stop()
    first, second, third = leases.at[:3]
    assert first - leases.started >= 0.02, "the first renew waits one interval"
    assert second - first >= 0.02 and third - second >= 0.02
    assert beat.renewals >= 3 and beat.lease.revision == 1 + beat.renewals


class CountingLeases:
    """``renew`` that records when it was called."""

    def __init__(self) -> None:
        self.started = asyncio.get_running_loop().time()
        self.at: list[float] = []
        self.third = asyncio.Event()

    async def renew(self, lease: Lease) -> Lease:
        self.at.append(asyncio.get_running_loop().time())
        if len(self.at) >= 3:
            self.third.set()
        return dataclasses.replace(lease, revision=lease.revision + 1)


class GapDelivery(FakeDelivery):
    """A delivery that records the gap each ``in_progress`` asks for."""

    def __init__(self) -> None:
        super().__init__(b"")
        self.gaps: list[float] = []

    async def in_progress(self, *, unless_within: float = 0.0) -> None:
        self.gaps.append(unless_within)
        await super().in_progress(unless_within=unless_within)


async def test_the_heartbeats_of_a_runs_tiles_reset_their_message_once_a_beat() -> None:
    """Every tile of a run beats on the same message: each asks to reset its deadline unless
    it was reset within half an interval, so tiles due together send one reset (the gap
    itself is tested against the server in ``tests/stores/test_settle.py``)."""
    lease = Lease("tile.j.0", token=1, revision=1, owner=LeaseOwner("n", "a"), ttl=2)
    leases, delivery = CountingLeases(), GapDelivery()
    beat = Heartbeat(leases, lease, delivery, 0.02, Log("test")).start()
    await asyncio.wait_for(leases.third.wait(), 5)
    await beat.stop()
    assert len(delivery.gaps) >= 2 and set(delivery.gaps) == {0.01}
    assert delivery.in_progress_calls >= 2, "one beat apart: each reset is sent"
