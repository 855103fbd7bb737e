"""The gateway's bounded intake: two lanes, ``busy`` when a lane is full, large bodies off the loop.

nats-server cannot slow a sender down on a core NATS subscription: it buffers what the gateway
has not read yet, up to its ``max_pending`` (NATS's default 64 MiB; Tessera's configurations
set :data:`proto.limits.NATS_MAX_PENDING`), and then cuts the gateway's connection as
a slow consumer, losing everything buffered. So the gateway must read as fast as requests come,
whatever they cost to serve. It does, by deciding at once for every request:

- a request whose body is below ``large_body_bytes`` (status, list, cancel, a submit naming
  a builtin scene ...) takes one of the small lane's ``in_flight`` places;
- a larger one (a submit with an inline scene) takes one of the large lane's ``large_in_flight``
  places and is decoded, validated and hashed in a separate process (``large_workers`` of them,
  started in the background when the gateway starts: :meth:`Intake.start`, so the first large
  submit of a burst does not wait for a process to spawn and import the scene checks; it costs
  one Python process of about 70 MB resident, 40 MB of it its own: numpy, no numba, measured
  with psutil). Not a thread: pure-Python work on a thread holds
  the GIL, and every time the event loop waits for the socket it then waits up to the 5 ms
  switch interval to get it back, so one busy thread cut the gateway's reading to a few MB/s
  (measured: a trivial responder with one CPU-bound thread beside it was cut as a slow consumer
  by the same burst it otherwise served in 1.2 s);
- a request whose lane is full is answered at once with the error ``busy`` and a
  ``retry_after`` hint (seconds: the lane's recent service time times its depth over its
  parallelism, within :data:`MIN_RETRY_AFTER`..:data:`MAX_RETRY_AFTER`). Nothing was decoded or
  written, so the client may send it again as is (``tessera`` does, within ``--timeout``).

The sizes are the gateway's settings (:class:`~shared.core.config.GatewaySettings`,
``TESSERA_GATEWAY_*``).

The client library's buffer per subscription (:meth:`Intake.pending_limits`) only has to hold
what arrives between two turns of the event loop, since admission never waits.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.core.config import GatewaySettings
from shared.core.errors import StoreUnavailable

__all__ = ["MAX_RETRY_AFTER", "MIN_RETRY_AFTER", "Intake", "Lane"]

T = TypeVar("T")
MIN_RETRY_AFTER = 0.05
MAX_RETRY_AFTER = 5.0
_EWMA = 0.2


@dataclass
class Lane:
    """A bounded number of requests served at once, and how long they took of late."""

    name: str
    capacity: int
    parallel: int
    in_use: int = 0
    #: moving average of the seconds a request of this lane took (start value: a guess)
    mean_seconds: float = 0.05

    def take(self) -> bool:
        """Claim a place; False when the lane is full."""
        if self.in_use >= self.capacity:
            return False
        self.in_use += 1
        return True

    def release(self, seconds: float) -> None:
        """Give the place back after a request that took ``seconds``."""
        self.in_use -= 1
        self.mean_seconds += _EWMA * (seconds - self.mean_seconds)

    def retry_after(self) -> float:
        """Seconds until a place is likely free: the lane's backlog at its recent pace."""
        wait = self.mean_seconds * self.capacity / max(1, self.parallel)
        return round(min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, wait)), 3)


class Intake:
    """The two lanes of one gateway and the worker processes of the large one."""

    def __init__(
        self,
        *,
        in_flight: int = GatewaySettings.in_flight,
        large_in_flight: int = GatewaySettings.large_in_flight,
        large_workers: int = GatewaySettings.large_workers,
        large_body_bytes: int = GatewaySettings.large_body_bytes,
    ) -> None:
        self.small = Lane("small", in_flight, max(1, in_flight))
        self.large = Lane("large", large_in_flight, large_workers)
        #: bodies of this size or more go to the large lane and are decoded off the event loop
        self.large_body_bytes = large_body_bytes
        self._workers = large_workers
        self._pool: ProcessPoolExecutor | None = None
        #: done once every worker process has started and imported what a check needs
        self.warm: asyncio.Future[None] | None = None

    @classmethod
    def of(cls, settings: GatewaySettings) -> Intake:
        """The intake these settings size."""
        return cls(
            in_flight=settings.in_flight,
            large_in_flight=settings.large_in_flight,
            large_workers=settings.large_workers,
            large_body_bytes=settings.large_body_bytes,
        )

    def lane_for(self, size: int) -> Lane:
        """The lane of a request body of ``size`` bytes."""
        return self.large if size >= self.large_body_bytes else self.small

    def pending_limits(self, max_payload: int) -> tuple[int, int]:
        """nats-py pending limits of one subscription: messages, bytes.

        Admission never waits, so the buffer only holds what one read of the socket delivered:
        at most every place of both lanes several times over, and two of the largest messages.
        """
        return 32 * (self.small.capacity + self.large.capacity), 2 * max_payload

    def start(self, *modules: str) -> None:
        """Start the worker processes in the background, each importing ``modules``.

        Returns at once; :attr:`warm` is done when they are ready (a failed warm-up is only
        logged by its future: the first request then reports the broken pool).
        """
        pool = self._ensure_pool()
        loop = asyncio.get_running_loop()
        tries = [loop.run_in_executor(pool, _import_modules, modules) for _ in range(self._workers)]
        self.warm = asyncio.ensure_future(_all_done(tries))

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")  # never fork a process with threads
            self._pool = ProcessPoolExecutor(self._workers, mp_context=spawn)
        return self._pool

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker process (``fn`` and its arguments must pickle).

        A worker that died (killed, out of memory) breaks the pool: it is replaced and the
        request fails ``unavailable``, which a client may retry.
        """
        pool = self._ensure_pool()
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool as exc:
            if self._pool is pool:
                self._pool = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise StoreUnavailable("the gateway's scene checker restarted; try again") from exc

    def close(self) -> None:
        """Stop the worker processes (running checks are abandoned)."""
        if self.warm is not None and not self.warm.done():
            self.warm.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _import_modules(modules: tuple[str, ...]) -> int:
    """In a worker process: import ``modules`` (the warm-up); its pid, for the curious."""
    for name in modules:
        importlib.import_module(name)
    return os.getpid()


async def _all_done(tries: list[asyncio.Future[int]]) -> None:
    await asyncio.gather(*tries)
