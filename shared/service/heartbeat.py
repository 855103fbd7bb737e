"""The heartbeat: renews the lease and extends the ack deadline on a timer, off the kernel.

It runs as its own asyncio task while the kernel renders in a thread (numba releases the GIL), so
a long pass never delays it. It never raises into the tile: a lost lease sets :attr:`lost`, which
the render loop checks between passes, and the tile then stops and commits nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from shared.core import crash
from shared.core.errors import LeaseLost, RetryableError
from shared.nats.leases import Lease
from shared.service.logs import Log
from shared.service.settle import Delivery

__all__ = ["Heartbeat", "Renewer"]


class Renewer(Protocol):
    """What a heartbeat needs of a lease store (:class:`shared.nats.leases.Leases` has it)."""

    async def renew(self, lease: Lease) -> Lease: ...


class Heartbeat:
    """Keeps one lease (and its message) alive until stopped or lost."""

    def __init__(
        self, leases: Renewer, lease: Lease, delivery: Delivery | None, interval: float, log: Log
    ) -> None:
        self.leases = leases
        self.lease = lease
        self.delivery = delivery
        self.interval = interval
        self.log = log
        self.lost = asyncio.Event()
        self.renewals = 0
        self.last_renewed = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> Heartbeat:
        """Begin beating: the first renew is due after ``interval``, and the beating task starts
        only then (a short tile that ends sooner, as most do, never needs one)."""
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._launch)
        return self

    def _launch(self) -> None:
        if not self._stopping:
            self._task = asyncio.create_task(self._beat())

    async def stop(self) -> Lease:
        """Stop beating; returns the latest lease (its revision is the release's CAS base).

        The task is cancelled until it is done: on Python 3.11 ``asyncio.wait_for`` (inside the
        NATS client) can swallow a cancel that lands as its request completes, and a heartbeat
        that survived its cancel would renew the lease forever. ``asyncio.wait`` never raises
        the task's cancellation into the caller, so a cancel of the caller itself still
        propagates.
        """
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        task = self._task
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        return self.lease

    async def _beat(self) -> None:
        # (started when the first renew is due; then one renew each ``interval``)
        while not self._stopping:
            try:
                renewed = await self.leases.renew(self.lease)
                crash.crash_point("worker.during_renew")
                self.lease = renewed
                self.renewals += 1
                self.last_renewed = time.monotonic()
                self.log.debug("lease renewed", key=renewed.key, revision=renewed.revision)
                if self.delivery is not None:  # (once a beat for the heartbeats of a run)
                    await self.delivery.in_progress(unless_within=self.interval / 2)
            except LeaseLost as exc:
                self.log.warning("lease lost", key=self.lease.key, error=str(exc))
                self.lost.set()
                return
            except RetryableError as exc:
                # Not raised today (an unconfirmed renew is LeaseLost; nats-py buffers an
                # in_progress() while disconnected): a transient error elsewhere is logged and
                # the next beat tries again, the TTL still bounds how long that can go on.
                self.log.warning("heartbeat hiccup", key=self.lease.key, error=str(exc))
            except Exception:
                self.log.error("heartbeat failed; treating the lease as lost", exc=True)
                self.lost.set()
                return
            await asyncio.sleep(self.interval)
