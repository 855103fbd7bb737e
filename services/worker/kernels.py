"""The worker's kernel threads, and how a sample pass is spread over them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import kernel.render  # numba loads when the worker starts, not on its first tile
from kernel.rect import Rect
from shared.core.tiles import Accumulator

__all__ = ["KernelThreads"]


class KernelThreads:
    """``slots`` threads running the kernel (numba releases the GIL), and what runs on them."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.executor = ThreadPoolExecutor(slots, thread_name_prefix="kernel")
        #: kernel calls submitted and not finished
        self.running = 0

    async def render(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> None:
        """Samples ``start..end`` of ``rect`` into ``acc`` on the kernel threads.

        A pass normally runs on one thread, beside the passes of the other tiles in hand. When
        threads are idle (the queue ran dry and fewer passes than threads are left, as at the
        end of a job) the pass is split into horizontal bands, one per idle thread, so the last
        tiles do not leave cores waiting. The kernel works pixel by pixel, so the accumulator
        holds the same bits either way.
        """
        loop = asyncio.get_running_loop()
        rows = rect.y1 - rect.y0
        bands = max(1, min(self.slots - self.running, rows))
        cuts = [rows * i // bands for i in range(bands + 1)]
        calls = []
        for top, bottom in itertools.pairwise(cuts):
            band = Rect(rect.x0, rect.y0 + top, rect.x1, rect.y0 + bottom)
            work = self.executor.submit(
                kernel.render_tile, prepared, band, start, end, acc[top:bottom]
            )
            self.running += 1
            # Counted down when the thread is done, not when an awaiting task gives up on it
            # (a watchdog timeout leaves the call running).
            work.add_done_callback(functools.partial(self._finished_on, loop))
            calls.append(asyncio.wrap_future(work, loop=loop))
        await asyncio.gather(*calls)

    def _finished_on(self, loop: asyncio.AbstractEventLoop, _work: object) -> None:
        # On the kernel thread: hand the count to the loop (gone already at shutdown).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._finished)

    def _finished(self) -> None:
        self.running -= 1
