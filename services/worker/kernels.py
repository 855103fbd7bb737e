"""The worker's kernel threads, and how a sample pass is spread over them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from weakref import WeakKeyDictionary

import kernel.render  # numba loads when the worker starts, not on its first tile
from kernel.rect import Rect
from shared.core.tiles import Accumulator

__all__ = ["BAND_SECONDS", "INLINE_SECONDS", "INLINE_WORK", "KernelThreads"]

INLINE_SECONDS = 0.0005
"""A pass predicted (from the scene's last measured pass) to take less than this runs on the
event loop's own thread: handing it to a kernel thread — a queue, a wake-up, a future and a
callback back to the loop — costs the loop more than the pass itself (an 8x8 tile at 1 spp
renders in about 0.2 ms)."""
INLINE_WORK = 64 * 64
"""...and covers at most this many pixel-samples, so a misjudged rate blocks the loop little."""
BAND_SECONDS = 0.05
"""A pass predicted (from the scene's last measured pass) to take longer is split into row
bands of about this long, queued together: a thread that finishes a band takes the next one
queued (any tile's) without a round trip to the event loop, and the job's last bands leave a
thread idle at most about this long. Whole passes (sized to ``TESSERA_PASS_SECONDS``) left one
kernel thread idle for up to a pass at the end of each job while the other rendered the last
one: 237 ms of a 9-tile job's 4.9 s on 2 threads (issue 19, ``bench.pipeline`` (a auto))."""


class KernelThreads:
    """``slots`` threads running the kernel (numba releases the GIL), and what runs on them."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.executor = ThreadPoolExecutor(slots, thread_name_prefix="kernel")
        #: kernel calls submitted and not finished
        self.running = 0
        #: passes rendered on the loop's thread (:data:`INLINE_SECONDS`)
        self.inline_passes = 0
        #: seconds per pixel-sample of each scene's last measured pass
        self._rates: WeakKeyDictionary[kernel.Prepared, float] = WeakKeyDictionary()

    async def render(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        """Samples ``start..end`` of ``rect`` into ``acc`` on the kernel threads; the seconds
        its calls took on their threads, summed (not the wait for a thread).

        A pass is split into horizontal bands, queued beside the bands of the other tiles in
        hand: one per idle thread (the queue ran dry and fewer passes than threads are left, as
        at the end of a job), and at least as many as take :data:`BAND_SECONDS` each at the
        scene's measured rate, so the last tiles do not leave cores waiting. The kernel works
        pixel by pixel, so the accumulator holds the same bits either way. A tiny pass runs
        inline (:data:`INLINE_SECONDS`).
        """
        work = (rect.x1 - rect.x0) * (rect.y1 - rect.y0) * (end - start)
        rate = self._rates.get(prepared)
        if rate is not None and work <= INLINE_WORK and rate * work <= INLINE_SECONDS:
            seconds = _timed(prepared, rect, start, end, acc)
            self._rates[prepared] = seconds / work
            self.inline_passes += 1
            return seconds
        loop = asyncio.get_running_loop()
        rows = rect.y1 - rect.y0
        bands = max(1, self.slots - self.running)
        if rate is not None:
            bands = max(bands, math.ceil(rate * work / BAND_SECONDS))
        bands = min(bands, rows)
        cuts = [rows * i // bands for i in range(bands + 1)]
        calls = []
        for top, bottom in itertools.pairwise(cuts):
            band = Rect(rect.x0, rect.y0 + top, rect.x1, rect.y0 + bottom)
            call = self.executor.submit(_timed, prepared, band, start, end, acc[top:bottom])
            self.running += 1
            # Counted down when the thread is done, not when an awaiting task gives up on it
            # (a watchdog timeout leaves the call running).
            call.add_done_callback(functools.partial(self._finished_on, loop))
            calls.append(asyncio.wrap_future(call, loop=loop))
        took = await asyncio.gather(*calls)
        self._rates[prepared] = took[-1] * len(calls) / work
        return float(sum(took))

    def _finished_on(self, loop: asyncio.AbstractEventLoop, _work: object) -> None:
        # On the kernel thread: hand the count to the loop (gone already at shutdown).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._finished)

    def _finished(self) -> None:
        self.running -= 1


def _timed(prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator) -> float:
    """:func:`kernel.render_tile`, and the seconds it took."""
    began = time.perf_counter()
    kernel.render_tile(prepared, rect, start, end, acc)
    return time.perf_counter() - began
