"""The render loop of one tile attempt: sample passes off the event loop, checks between them.

The loop is renderer-agnostic: the job's :class:`~services.worker.renderers.Renderer` prepares
the scene and renders each pass; its pass plan fixes where passes end, or (``None``, the numba
kernel) passes are sized from the measured rate (:func:`first_pass`, :func:`pass_size`).

Between passes: lease still held? the worker draining? the job cancelled? an event saying the
job was paused or failed (then its row is read at once)? Every ``checkpoint_interval`` the job's
row is read (cancelled, paused or ended: :func:`~services.worker.context.control_stop`) and a
checkpoint written. The loop
ends :class:`Finished` or :class:`Stopped` with a :class:`~services.worker.context.StopReason`;
the tile run commits or settles what that means.

A pass of a renderer that can be interrupted (``Renderer.interruptible``: Blender, POV-Ray, a
child process) is raced against the same signals *during* the pass: the heartbeat's ``lost``
event, the worker's drain and the job's cancel, pause or failure events
(:class:`~services.worker.context.Wakers`). When one fires the render call is cancelled (the
renderer kills its process group) and the loop stops at the pass's start: the pass renders into
a scratch accumulator added to the tile's only when it completes, so the partial pass is
discarded and the tile resumes from its last checkpoint. The numba kernel's passes run on
threads that cannot be stopped; they are awaited directly as before (no task per pass).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernel.rect import Rect
from services.worker.checkpoints import Checkpoints
from services.worker.context import StopReason, TileContext, control_stop
from services.worker.renderers import PassPlan, Renderer, check_plan
from shared.core.config import WorkerSettings
from shared.core.errors import RetryableError
from shared.core.tiles import Accumulator
from shared.metadata import Job, Tile
from shared.service.heartbeat import Heartbeat
from shared.service.logs import Log

__all__ = [
    "Finished",
    "Render",
    "Stalled",
    "Stopped",
    "adaptive_end",
    "first_pass",
    "pass_size",
    "watchdog_bound",
]


class Stalled(RetryableError):
    """A sample pass made no progress within ``progress_timeout`` (the watchdog fired)."""

    code = "stalled"


@dataclass(frozen=True)
class Finished:
    """The render reached the job's samples per pixel."""

    samples: int
    #: seconds of one core its passes took on the renderer (the attempt's ``render_seconds``)
    render_seconds: float = 0.0


@dataclass(frozen=True)
class Stopped:
    """The render (or the commit) stopped short at ``samples``, for ``reason``."""

    reason: StopReason
    samples: int


class Render:
    """Renders one fenced tile for one attempt."""

    def __init__(
        self,
        ctx: TileContext,
        job: Job,
        tile: Tile,
        beat: Heartbeat,
        log: Log,
        renderer: Renderer,
    ) -> None:
        self.ctx, self.job, self.tile, self.beat, self.log = ctx, job, tile, beat, log
        self.renderer = renderer
        self._last_read = 0.0  # when the job's row was last read (monotonic)
        #: seconds of one core the passes rendered so far took (what each pass reported)
        self.render_seconds = 0.0
        self._adaptive = False  # passes sized by rate (the renderer has no pass plan)

    async def run(self, acc: Accumulator, cp: Checkpoints) -> Finished | Stopped:
        """Render from ``cp.resumed_from`` to the job's spp into ``acc``, checkpointing.

        The scene's asset (a Blender or POV-Ray job's) is held for the whole render: the
        renderer reads its files during passes (:meth:`SceneCache.use
        <services.worker.scenes.SceneCache.use>`).
        """
        async with self.ctx.scenes.use(self.job, self.renderer) as prepared:
            return await self._run(prepared, acc, cp)

    async def _run(self, prepared: Any, acc: Accumulator, cp: Checkpoints) -> Finished | Stopped:
        job, beat, tuning = self.job, self.beat, self.ctx.worker_config
        plan = self.renderer.passes(job)
        if plan is not None:
            plan = check_plan(plan, job.spp)
        self._adaptive = plan is None
        rect: Rect = self.tile.rect
        interruptible = self.renderer.interruptible
        samples = cp.resumed_from
        size = first_pass(self.ctx.rates.get(job.job_id), _pixels(rect), tuning)
        last_checkpoint = self._last_read = time.monotonic()
        while samples < job.spp:
            if why := await self._stop_now():
                return Stopped(why, samples)
            end = _pass_end(plan, samples, size, job.spp, tuning)
            before, started = self.render_seconds, time.monotonic()
            if not interruptible:
                await self._pass(prepared, rect, samples, end, acc)
            elif why := await self._raced_pass(prepared, rect, samples, end, acc):
                return Stopped(why, samples)  # the partial pass is discarded
            if plan is None:
                took, waited = self.render_seconds - before, time.monotonic() - started
                size = watchdog_bound(pass_size(end - samples, took, tuning),
                                      end - samples, waited, tuning)  # fmt: skip
            samples = end
            due = time.monotonic() - last_checkpoint >= tuning.checkpoint_interval
            if due and samples < job.spp:
                # An event may have been missed (a reconnect): ask the source of truth.
                if why := await self._job_stop():
                    return Stopped(why, samples)
                if why := self._stop_reason():
                    return Stopped(why, samples)
                if not await cp.write(acc, samples, beat.lease.token):
                    return Stopped(StopReason.FENCED, samples)
                last_checkpoint = self._last_read = time.monotonic()
        return Finished(samples, self.render_seconds)

    async def _job_stop(self) -> StopReason | None:
        """One read of the job's row: cancelled, paused or ended (failed for good)?"""
        self._last_read = time.monotonic()
        return control_stop(await self.ctx.db.job_control(self.job.job_id))

    async def _stop_now(self) -> StopReason | None:
        """Lease lost, drain or cancel; or an event says the job was paused or failed: then
        its row decides, now (a job paused and resumed since goes on)."""
        if why := self._stop_reason():
            return why
        if self.ctx.stop.changed_since(self.job.job_id, self._last_read):
            return await self._job_stop()
        return None

    def _stop_reason(self) -> StopReason | None:
        if self.beat.lost.is_set():
            return StopReason.LEASE_LOST
        return self.ctx.stop.reason(self.job.job_id)

    async def _raced_pass(
        self, prepared: Any, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> StopReason | None:
        """One pass raced against the stop signals: ``None`` once it is added to ``acc``, or
        why it was cancelled (``acc`` untouched). The renderer's own failure propagates."""
        scratch = np.zeros_like(acc)
        with self.ctx.stop.wakers.watch(self.job.job_id) as woken:
            render = asyncio.ensure_future(self._pass(prepared, rect, start, end, scratch))
            watch = asyncio.ensure_future(self._watch(woken))
            try:
                await asyncio.wait({render, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # (also when this task is cancelled: the pass must not outlive the attempt)
                for task in (watch, render):
                    while not task.done():
                        task.cancel()
                        await asyncio.wait({task})
        if not render.cancelled():
            render.result()  # the renderer's Terminal/RetryableError, or Stalled
            acc += scratch  # (0 + x is x: the same bits as rendering into acc)
            return None
        return watch.result()

    async def _watch(self, woken: asyncio.Event) -> StopReason:
        """Returns once the tile should stop: lease lost, drain, cancel, or the job's row says
        so after an event about the job (a pause or resume: the row decides)."""
        waits = [self.beat.lost, self.ctx.stop.handing_back, woken]
        tasks = [asyncio.ensure_future(event.wait()) for event in waits]
        try:
            while True:
                woken.clear()
                if why := await self._stop_now():
                    return why
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                if tasks[2].done():
                    tasks[2] = asyncio.ensure_future(woken.wait())
        finally:
            for task in tasks:
                task.cancel()

    async def _pass(
        self, prepared: Any, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> None:
        # The renderer raises its own Terminal/RetryableError; a timeout cancels its call,
        # and a renderer with a process kills it before the cancellation ends.
        try:
            seconds = await asyncio.wait_for(
                self.renderer.render(prepared, rect, start, end, acc),
                self.ctx.worker_config.progress_timeout,
            )
        except TimeoutError:
            raise Stalled(f"samples {start}..{end} made no progress") from None
        self.render_seconds += seconds
        samples = (end - start) * _pixels(rect)
        if self._adaptive:  # (a renderer with a pass plan never reads the rates)
            self.ctx.rates.record(self.job.job_id, seconds, samples)
        self.ctx.metrics.samples_rendered.inc(samples)


GROWTH = 16
"""An adaptive pass is at most this many times the one before it (a first pass: times
``samples_per_pass``)."""


def _pixels(rect: Rect) -> int:
    return (rect[2] - rect[0]) * (rect[3] - rect[1])


def _pass_end(
    plan: PassPlan | None, samples: int, size: int, spp: int, tuning: WorkerSettings
) -> int:
    """Where the pass starting at ``samples`` ends: by ``plan``, else adaptively."""
    if plan is not None:
        return _next_end(plan, samples)
    return adaptive_end(samples, size, spp, tuning)


def _next_end(plan: PassPlan, samples: int) -> int:
    """Where the pass starting at ``samples`` ends under a fixed ``plan``."""
    return plan[bisect.bisect_right(plan, samples)]


def first_pass(rate: float | None, pixels: int, tuning: WorkerSettings) -> int:
    """Samples per pixel of an adaptive tile's first pass over ``pixels``.

    ``samples_per_pass`` while the job's ``rate`` (seconds of one core per pixel-sample, of its
    slowest pass on this worker: :class:`~services.worker.context.PassRates`) is unknown; then
    sized to take about ``pass_seconds`` of one core, within the bounds of :func:`pass_size`
    (at least ``samples_per_pass``, at most 16 times it). Starting every tile at
    ``samples_per_pass`` cost its tiles two more passes each (issue 19: 64x64 tiles of 64
    samples took passes of 4, 58 and 2), each a round trip to the event loop and its bands'
    hand-offs, for a rate the worker had already measured on the job's earlier tiles.
    """
    floor = tuning.samples_per_pass
    if rate is None or tuning.pass_seconds <= 0 or pixels <= 0:
        return floor
    return max(floor, min(int(tuning.pass_seconds / (rate * pixels)), GROWTH * floor))


def watchdog_bound(size: int, samples: int, waited: float, tuning: WorkerSettings) -> int:
    """``size``, or fewer samples if at the pace of the last pass on the loop (``samples`` in
    ``waited`` seconds, its wait for a kernel thread included) they would take over half of
    ``progress_timeout``: a pass sized in one core's seconds must not run into the watchdog on
    a worker whose threads are shared by many tiles. Never below ``samples_per_pass``."""
    if waited <= 0 or samples <= 0:
        return size
    most = int(samples * tuning.progress_timeout / 2 / waited)
    return max(tuning.samples_per_pass, min(size, most))


def adaptive_end(samples: int, size: int, spp: int, tuning: WorkerSettings) -> int:
    """Where an adaptive pass of ``size`` starting at ``samples`` ends: at most ``spp``, and
    at ``spp`` when it would leave fewer than a quarter of ``size`` samples for a pass of
    their own (a short last pass costs a round trip for little work). With
    ``pass_seconds = 0`` every pass has ``size`` samples, the last one the rest."""
    end = min(spp, samples + size)
    if tuning.pass_seconds > 0 and 4 * (spp - end) < size:
        return spp
    return end


def pass_size(samples: int, seconds: float, tuning: WorkerSettings) -> int:
    """Samples per pixel of the next pass, after a pass of ``samples`` took ``seconds``.

    Sized from the measured rate to take about ``pass_seconds`` of one core: never below
    ``samples_per_pass``, and at most 16 times the last pass, so one fast outlier cannot make a
    pass that outlasts the cancel and checkpoint grain by much. ``seconds`` is what the pass
    took on the renderer (its bands' seconds summed), not its wall time on the loop: that
    includes the wait for a kernel thread behind the other tiles in hand, and sized the passes
    of a job's first tiles, started before its rate was known, at the floor for good (issue
    19: (a)'s first 16 tiles took 16 passes of 4 samples each, were in flight for the whole
    job and needed lease renewals, while later tiles took one pass).
    """
    floor = tuning.samples_per_pass
    if tuning.pass_seconds <= 0 or samples <= 0:
        return floor
    if seconds <= 0:
        return max(floor, GROWTH * samples)
    wanted = int(samples * tuning.pass_seconds / seconds)
    return max(floor, min(wanted, GROWTH * samples))
