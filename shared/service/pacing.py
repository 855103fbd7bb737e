"""Fixed pacing for operator replays: at most ``rate`` actions per second, no bursts.

A token bucket of capacity one: the first action goes at once, each later one waits until
``1 / rate`` seconds after the previous one. Replaying a thousand dead letters at 10/s thus
takes 100 s instead of landing on the workers at once — a replay cannot start a retry storm.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["Pacer"]


class Pacer:
    """Spaces calls of :meth:`wait` at least ``1 / rate`` seconds apart."""

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate={rate!r} must be > 0 per second")
        self.interval = 1.0 / rate
        self._clock, self._sleep = clock, sleep
        self._next: float | None = None

    async def wait(self) -> None:
        """Return when the next action may start."""
        now = self._clock()
        if self._next is not None and now < self._next:
            await self._sleep(self._next - now)
            now = self._next
        self._next = now + self.interval
