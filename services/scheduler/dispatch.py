"""The dispatcher: releases waiting tiles into ``TILES`` as the live workers have room.

The planner only writes tile rows; the tiles wait in PostgreSQL. A **round**
(:meth:`Dispatcher.dispatch_once`) reads the capacity of the live workers (the
``tessera-workers`` bucket: their kernel threads per renderer, read at most every
:data:`CAPACITY_REFRESH` s; the window below), lets the store release up to
``TESSERA_DISPATCH_BATCH`` tiles in one transaction (:func:`shared.metadata.dispatch.release`:
window, priority, fair share, oldest job; ``generation + 1``, ``published_at = now()``), then
publishes them under ``tile:<job>:<i>:<gen>`` — the consecutive short tiles of a ``tessera`` job
as one message carrying a run (:meth:`Dispatcher.run_of`, ``TESSERA_DISPATCH_RUN``), which
counts once in the window. A crash
between the commit and the publishes
(crash points ``scheduler.after_release``, ``scheduler.mid_publish``) leaves released tiles with
no message: the sweeper re-publishes them after ``TESSERA_SWEEP_AGE``.

The window per renderer is :func:`shared.core.window.window`: the base (factor x threads) plus,
for short tiles, a buffer waiting in ``TILES`` sized by the tiles' measured duration (the mean
done attempt of the last :data:`TILE_SECONDS_WINDOW` s, read at most every
:data:`TILE_SECONDS_REFRESH` s) and the measured round latency (an EWMA of nudge to the round's
last publish).

Rounds are brought by events, with a timer as the net for what no event announces (a worker
joining, a lost nudge): a nudge ends any wait at once. Every new plan of this process's
planner and every job-control event (:data:`proto.names.DISPATCH_NUDGES`: a resume makes
tiles releasable again; a pause, cancel, failure or dead letter frees room; a retry) start one
at once;
tiles that left a worker's hand start one after ``refill`` of them (with long tiles, no buffer,
the fewest tiles a live worker holds beyond one per thread: as many as its threads by default;
with a buffer, half the buffer has been taken by then). The workers count them and say how many
in a ``Room`` message every few tiles (``tessera.room``, core NATS: a hint, not a durable
consumer; :mod:`services.worker.room`); while a live worker does not announce that it sends them
(one from before them), the dispatcher counts the tile-done events instead, one per tile, as it
did before. The timer waits
``TESSERA_DISPATCH_INTERVAL``, doubled after each round that released nothing up to
``TESSERA_DISPATCH_IDLE_INTERVAL`` and left as it was by a round that released tiles on a nudge
(:func:`backoff_after`, :func:`idle_wait`): an idle farm, or one whose windows are full between
tile-done events, runs a transaction every couple of seconds, not four a second; a round the
timer started that releases tiles brings the short wait back (a lost nudge costs at most the
idle interval). Nudges during a round are
coalesced into the next round. A round that filled its batch runs the next at once. Several
schedulers may run dispatchers at once: their releases take turns under one advisory lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from proto import names as n
from proto.messages import Room
from shared.core import crash
from shared.core import window as rule
from shared.core.errors import DecodeError, RetryableError, TerminalError
from shared.core.runs import run_length
from shared.core.window import Ewma, Window
from shared.metadata import Tile
from shared.nats.presence import LiveWorkers, capacity, spare
from shared.service.publish import publish_released
from shared.service.runtime import Runtime

__all__ = [
    "CAPACITY_REFRESH",
    "TILE_SECONDS_REFRESH",
    "TILE_SECONDS_WINDOW",
    "Dispatcher",
    "backoff_after",
    "idle_wait",
]

CAPACITY_REFRESH = 1.0
"""Seconds a reading of the live-workers bucket is reused (rounds can run hundreds a second)."""
TILE_SECONDS_REFRESH = 0.5
"""Seconds a reading of the recent tile durations is reused."""
TILE_SECONDS_WINDOW = 10.0
"""Seconds of done attempts the mean tile duration is taken over."""
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
        #: seconds from a nudge to the last publish of the round that answered it
        self.gap = Ewma()
        #: the windows of the last capacity reading, by renderer
        self.windows: dict[str, Window] = {}
        self._threads: dict[str, int] = {}
        self._spare: dict[str, int] = {}
        self._threads_at = -math.inf
        self._tile_seconds: dict[str, float] = {}
        self._tile_seconds_at = -math.inf
        self._backlog_at = -math.inf
        self._done = 0  # tiles done (or left a worker's hand) since the last round started
        self._refill = 1  # such tiles that make a round due
        #: every live worker sends ``Room`` messages: count them, not tile-done events
        self.rooms = False
        self._tile_dones: Subscription | None = None
        self._nudged_at: float | None = None  # first due nudge since the last round started
        self._empty = 0  # the timer's backoff: rounds since one it started found tiles

    def nudge(self) -> None:
        """Run a round soon (a job was planned, or a job-control event came)."""
        if self._nudged_at is None:
            self._nudged_at = asyncio.get_running_loop().time()
        self.wake.set()

    def tile_done(self, tiles: int = 1) -> None:
        """``tiles`` finished (or left a worker's hand): a round is due after ``refill``."""
        self._done += tiles
        if self._done >= self._refill:
            self.nudge()

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop``."""
        room = await self.rt.nc.subscribe(self.rt.names.room_subject, cb=self._on_room)
        await self._hear_tile_dones()
        controls = [
            await self.rt.nc.subscribe(self.rt.names.event_filter(kind), cb=self._on_control)
            for kind in n.DISPATCH_NUDGES
        ]
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                # No await between here and the round's start: a nudge from now on is the next's.
                self.wake.clear()
                nudged_at, self._nudged_at, self._done = self._nudged_at, None, 0
                full = False
                try:
                    released = len(await self.dispatch_once())
                    full = released >= self.config.dispatch_batch
                    self._empty = backoff_after(self._empty, released, nudged_at is not None)
                    if nudged_at is not None:
                        self.gap.add(loop.time() - nudged_at)
                    await self._count_backlog()
                except (RetryableError, TerminalError) as exc:
                    self.log.warning("dispatch round failed; next round retries", error=str(exc))
                if not full:
                    wait = idle_wait(self.config.dispatch_interval,
                                     self.config.dispatch_idle_interval, self._empty)  # fmt: skip
                    await _first(stop, self.wake, wait)
        finally:
            subs = [room, *controls, *([self._tile_dones] if self._tile_dones else [])]
            self._tile_dones = None
            for sub in subs:  # each on its own: one that fails does not keep the others
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _hear_tile_dones(self) -> None:
        """Subscribe to the tile-done events while a live worker sends no ``Room`` messages
        (:attr:`rooms`, from the last capacity reading), unsubscribe once every one does: then
        the scheduler is not woken by every tile."""
        try:
            if self.rooms and self._tile_dones is not None:
                sub, self._tile_dones = self._tile_dones, None
                await sub.unsubscribe()
            elif not self.rooms and self._tile_dones is None:
                done = self.rt.names.tile_done_filter
                self._tile_dones = await self.rt.nc.subscribe(done, cb=self._on_done)
        except NatsError as exc:  # (closed or draining: stopping; the next reading tries again)
            self.log.warning("tile-done subscription not changed", error=repr(exc))

    async def _on_done(self, _msg: Msg) -> None:
        if not self.rooms:
            self.tile_done()

    async def _on_room(self, msg: Msg) -> None:
        if not self.rooms:
            return  # the tile-done events are counted (a live worker sends no Room)
        try:
            room = Room.decode(msg.data)
        except DecodeError as exc:
            self.log.warning("undecodable room message ignored", error=str(exc))
            return
        self.tile_done(room.tiles)

    async def _on_control(self, _msg: Msg) -> None:
        self.nudge()

    async def capacity(self) -> dict[str, int]:
        """``renderer -> base + buffer`` of the live workers (:func:`shared.core.window.window`;
        the bucket and the tile durations are read at most every :data:`CAPACITY_REFRESH` and
        :data:`TILE_SECONDS_REFRESH` s)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._threads_at >= CAPACITY_REFRESH:
            live = await self.workers.list()
            self._threads = capacity(live, 1.0)
            self._spare = spare(live, self.config.dispatch_factor)
            self.rooms = bool(live) and all(w.room for w in live)
            await self._hear_tile_dones()  # (at once, even if this round then fails)
            self._threads_at = loop.time()
        if loop.time() - self._tile_seconds_at >= TILE_SECONDS_REFRESH:
            self._tile_seconds = await self.rt.db.tile_seconds(TILE_SECONDS_WINDOW)
            self._tile_seconds_at = loop.time()
        c = self.config
        self.windows = {
            renderer: rule.window(
                threads,
                factor=c.dispatch_factor,
                max_factor=c.dispatch_max_factor,
                tile_seconds=self._tile_seconds.get(renderer),
                gap_seconds=self.gap.value,
                spare=self._spare.get(renderer, 0),
            )
            for renderer, threads in self._threads.items()
        }
        self._refill = rule.refill_after(self.windows.values())
        m = self.rt.metrics
        for renderer, w in self.windows.items():
            m.dispatch_capacity.labels(renderer=renderer).set(w.base)
            m.dispatch_buffer.labels(renderer=renderer).set(w.buffer)
        return {renderer: w.capacity for renderer, w in self.windows.items()}

    async def dispatch_once(self, fixed: Mapping[str, int] | None = None) -> list[Tile]:
        """One round; the tiles it released (and published). ``fixed`` replaces the live
        workers' capacity (tests, the bench)."""
        cap = dict(fixed) if fixed is not None else await self.capacity()
        self.rt.metrics.dispatch_rounds.inc()
        released = await self.rt.db.release_tiles(
            cap, limit=self.config.dispatch_batch, usage_window=self.config.fair_share_window,
            run=self.run_of, most=self.config.dispatch_run,
        )  # fmt: skip
        m = self.rt.metrics
        for renderer, window in released.windows.items():
            m.dispatch_window.labels(renderer=renderer).set(window)
        tiles = released.tiles
        if not tiles:
            return []
        crash.crash_point("scheduler.after_release")
        await publish_released(self.rt, tiles, released.renderers, released.runs)
        by_renderer: dict[str, int] = {}
        for t in tiles:
            renderer = released.renderers.get(t.job_id, "")
            by_renderer[renderer] = by_renderer.get(renderer, 0) + 1
        for renderer, count in by_renderer.items():
            m.dispatch_released.labels(renderer=renderer).inc(count)
        self.log.debug("released", tiles=len(tiles), windows=released.windows)
        return tiles

    def run_of(self, renderer: str, spp: int, pixels: int) -> int:
        """Tiles per message of a job of ``renderer`` at ``spp`` whose whole tile has ``pixels``
        (:func:`shared.core.runs.run_length`) for ``tessera`` jobs. Other renderers' tiles go
        one per message: a Blender or POV-Ray tile is a process of its own, never short."""
        if renderer != n.RENDERER_TESSERA:
            return 1
        c = self.config
        return run_length(spp, pixels, most=c.dispatch_run, work=c.dispatch_run_work)

    async def _count_backlog(self) -> None:
        if self.rt.settings.process.metrics_port <= 0:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._backlog_at < BACKLOG_REFRESH:
            return
        self._backlog_at = loop.time()
        self.rt.metrics.dispatch_unreleased.set(await self.rt.db.unreleased_tiles())


def backoff_after(empty: int, released: int, nudged: bool) -> int:
    """The backoff count after a round that followed ``empty`` rounds of it and released
    ``released`` tiles; ``nudged``: an event started the round.

    A round that releases nothing counts one more. One that releases tiles on a nudge leaves
    the count as it was: events are bringing the rounds, and with the windows full only another
    event opens room, so the timer between them backs off as if the rounds were empty (it is
    the net for what no event announces). One the timer started that releases tiles resets it:
    something made tiles releasable without an event, so the timer polls at the short interval
    again.
    """
    if not released:
        return empty + 1
    return empty if nudged else 0


def idle_wait(interval: float, idle_interval: float, empty: int) -> float:
    """The wait before the next round after ``empty`` rounds in a row released nothing:
    ``interval`` doubled per empty round, at most ``idle_interval`` (never below
    ``interval``)."""
    return max(interval, min(interval * 2.0 ** min(empty, 32), idle_interval))


async def _first(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Wait until ``stop`` or ``wake`` is set, or ``seconds`` have passed."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
