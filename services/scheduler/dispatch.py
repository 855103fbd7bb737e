"""The dispatcher: releases waiting tiles into ``TILES`` as the live workers have room.

The planner only writes tile rows; the tiles wait in PostgreSQL. A **round**
(:meth:`Dispatcher.dispatch_once`) reads the capacity of the live workers (the
``tessera-workers`` bucket: ``TESSERA_DISPATCH_FACTOR`` x kernel threads per renderer, read at
most every :data:`CAPACITY_REFRESH` s), lets the store release up to ``TESSERA_DISPATCH_BATCH``
tiles in one transaction (:func:`shared.metadata.dispatch.release`: window, priority, fair share,
oldest job; ``generation + 1``, ``published_at = now()``), then publishes them under
``tile:<job>:<i>:<gen>``. A crash between the commit and the publishes (crash points
``scheduler.after_release``, ``scheduler.mid_publish``) leaves released tiles with no message:
the sweeper re-publishes them after ``TESSERA_SWEEP_AGE``.

Rounds run every ``TESSERA_DISPATCH_INTERVAL`` at the latest, sooner on a nudge: every
tile-done event (a plain core-NATS subscription to the EVENTS tile-done subjects: a hint that a
worker has room, not a durable consumer — a lost nudge costs one interval), every job-resumed
event (its tiles are releasable again) and every new plan of this process's planner. A round
that filled its batch runs the next at once. Several schedulers may run dispatchers at once:
their releases take turns under one advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping

from nats.aio.msg import Msg

from proto import names as n
from shared.core import crash
from shared.core.errors import RetryableError, TerminalError
from shared.metadata import Tile
from shared.nats.presence import LiveWorkers, capacity
from shared.service.publish import publish_released
from shared.service.runtime import Runtime

__all__ = ["CAPACITY_REFRESH", "Dispatcher"]

CAPACITY_REFRESH = 1.0
"""Seconds a reading of the live-workers bucket is reused (rounds can run hundreds a second)."""
BACKLOG_REFRESH = 5.0
"""Seconds between two counts of the unreleased tiles (a metric only)."""


class Dispatcher:
    """Releases tiles for one scheduler process."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="dispatcher")
        self.config = rt.settings.scheduler
        self.workers = LiveWorkers(rt.js, rt.names.bucket(n.BUCKET_WORKERS))
        self.wake = asyncio.Event()
        self._capacity: dict[str, int] = {}
        self._capacity_at = -math.inf
        self._backlog_at = -math.inf

    def nudge(self) -> None:
        """Run a round soon (a tile finished, a job was planned)."""
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop``."""
        sub = await self.rt.nc.subscribe(self.rt.names.tile_done_filter, cb=self._on_done)
        resumed = await self.rt.nc.subscribe(
            self.rt.names.event_filter(n.EventKind.JOB_RESUMED), cb=self._on_done
        )
        try:
            while not stop.is_set():
                self.wake.clear()
                full = False
                try:
                    full = len(await self.dispatch_once()) >= self.config.dispatch_batch
                    await self._count_backlog()
                except (RetryableError, TerminalError) as exc:
                    self.log.warning("dispatch round failed; next round retries", error=str(exc))
                if not full:
                    await _first(stop, self.wake, self.config.dispatch_interval)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
                await resumed.unsubscribe()

    async def _on_done(self, _msg: Msg) -> None:
        self.wake.set()

    async def capacity(self) -> dict[str, int]:
        """``renderer -> factor x threads`` of the live workers (cached briefly)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._capacity_at >= CAPACITY_REFRESH:
            live = await self.workers.list()
            self._capacity = capacity(live, self.config.dispatch_factor)
            self._capacity_at = loop.time()
            for renderer, cap in self._capacity.items():
                self.rt.metrics.dispatch_capacity.labels(renderer=renderer).set(cap)
        return self._capacity

    async def dispatch_once(self, fixed: Mapping[str, int] | None = None) -> list[Tile]:
        """One round; the tiles it released (and published). ``fixed`` replaces the live
        workers' capacity (tests, the bench)."""
        cap = dict(fixed) if fixed is not None else await self.capacity()
        self.rt.metrics.dispatch_rounds.inc()
        released = await self.rt.db.release_tiles(
            cap, limit=self.config.dispatch_batch, usage_window=self.config.fair_share_window
        )
        m = self.rt.metrics
        for renderer, window in released.windows.items():
            m.dispatch_window.labels(renderer=renderer).set(window)
        tiles = released.tiles
        if not tiles:
            return []
        crash.crash_point("scheduler.after_release")
        await publish_released(self.rt, tiles, released.renderers)
        by_renderer: dict[str, int] = {}
        for t in tiles:
            renderer = released.renderers.get(t.job_id, "")
            by_renderer[renderer] = by_renderer.get(renderer, 0) + 1
        for renderer, count in by_renderer.items():
            m.dispatch_released.labels(renderer=renderer).inc(count)
        self.log.debug("released", tiles=len(tiles), windows=released.windows)
        return tiles

    async def _count_backlog(self) -> None:
        if self.rt.settings.process.metrics_port <= 0:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._backlog_at < BACKLOG_REFRESH:
            return
        self._backlog_at = loop.time()
        self.rt.metrics.dispatch_unreleased.set(await self.rt.db.unreleased_tiles())


async def _first(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, or ``seconds`` have passed."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
