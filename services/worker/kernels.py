"""The worker's kernel threads, and how a sample pass is spread over them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
        self._lock = threading.Lock()  # (``running`` is counted down on the kernel threads)
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
        rows = rect.y1 - rect.y0
        bands = max(1, self.slots - self.running)
        if rate is not None:
            bands = max(bands, math.ceil(rate * work / BAND_SECONDS))
        bands = min(bands, rows)
        cuts = [rows * i // bands for i in range(bands + 1)]
        one = _Pass(asyncio.get_running_loop(), bands, self._count_down)
        calls: list[Future[None]] = []
        for i, (top, bottom) in enumerate(itertools.pairwise(cuts)):
            band = Rect(rect.x0, rect.y0 + top, rect.x1, rect.y0 + bottom)
            with self._lock:
                self.running += 1
            try:
                call = self.executor.submit(
                    one.band, i, prepared, band, start, end, acc[top:bottom]
                )
            except BaseException:  # (the threads were shut down): nothing of the pass runs
                self._count_down()
                for call in calls:
                    call.cancel()
                raise
            call.add_done_callback(functools.partial(self._unstarted, one, i))
            calls.append(call)
        try:
            took = await one.future
        except asyncio.CancelledError:
            for call in calls:  # (a watchdog timeout): the bands not yet started never run
                call.cancel()
            raise
        self._rates[prepared] = took[-1] * len(took) / work
        return float(sum(took))

    def _count_down(self) -> None:
        # On the kernel thread as its band ends (so the count is down before the pass's
        # result reaches the loop), or on the loop for a band cancelled before it started.
        with self._lock:
            self.running -= 1

    def _unstarted(self, one: _Pass, i: int, call: Future[None]) -> None:
        # A band cancelled before it started (its pass given up, or the threads shut down):
        # counted down, and ended in its pass, which is then settled if it was the last.
        if call.cancelled():
            self._count_down()
            one.end(i, 0.0, asyncio.CancelledError())


class _Pass:
    """The bands of one pass. Each band ends on its kernel thread; the last one to end hands
    the pass's outcome to the event loop in one call, so a pass costs the loop one wake-up
    however many bands it has (a wrapped future per band cost two: its result and its count)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, bands: int, ended: Callable[[], None]
    ) -> None:
        self.loop = loop
        #: the seconds each band took, in band order, once every band has ended
        self.future: asyncio.Future[list[float]] = loop.create_future()
        self._ended = ended
        self._left = bands
        self._took = [0.0] * bands
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def band(
        self, i: int, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> None:
        """Band ``i`` (on a kernel thread)."""
        took, error = 0.0, None
        try:
            took = _timed(prepared, rect, start, end, acc)
        except BaseException as exc:  # handed to the awaiting task, never lost with the thread
            error = exc
        self._ended()
        self.end(i, took, error)

    def end(self, i: int, took: float, error: BaseException | None) -> None:
        """Band ``i`` ended (ran, failed, or was cancelled before it started); the last band
        to end settles the pass on the loop (any thread)."""
        with self._lock:
            self._took[i] = took
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            last = self._left == 0
        if last:
            with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        # On the loop. A pass whose awaiting task gave up (cancelled) has nobody to tell.
        if self.future.done():
            return
        if self._error is not None:
            self.future.set_exception(self._error)
        else:
            self.future.set_result(self._took)


def _timed(prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator) -> float:
    """:func:`kernel.render_tile`, and the seconds it took."""
    began = time.perf_counter()
    kernel.render_tile(prepared, rect, start, end, acc)
    return time.perf_counter() - began
