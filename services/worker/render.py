"""The render loop of one tile attempt: sample passes off the event loop, checks between them.

The loop is renderer-agnostic: the job's :class:`~services.worker.renderers.Renderer` prepares
the scene and renders each pass; its pass plan fixes where passes end, or (``None``, the numba
kernel) passes are sized from the measured rate (:func:`pass_size`).

Between passes: lease still held? the worker draining? the job cancelled? an event saying the
job was paused or failed (then its row is read at once)? Every ``checkpoint_interval`` the job's
row is read (cancelled, paused or ended: :func:`~services.worker.context.control_stop`) and a
checkpoint written. The loop
ends :class:`Finished` or :class:`Stopped` with a :class:`~services.worker.context.StopReason`;
the tile run commits or settles what that means.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from dataclasses import dataclass
from typing import Any

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

__all__ = ["Finished", "Render", "Stalled", "Stopped", "pass_size"]


class Stalled(RetryableError):
    """A sample pass made no progress within ``progress_timeout`` (the watchdog fired)."""

    code = "stalled"


@dataclass(frozen=True)
class Finished:
    """The render reached the job's samples per pixel."""

    samples: int


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
        rect: Rect = self.tile.rect
        samples, size = cp.resumed_from, tuning.samples_per_pass
        last_checkpoint = self._last_read = time.monotonic()
        while samples < job.spp:
            if why := self._stop_reason():
                return Stopped(why, samples)
            # An event says the job was paused or failed: its row decides, now.
            changed = self.ctx.stop.changed_since(job.job_id, self._last_read)
            if changed and (why := await self._job_stop()):
                return Stopped(why, samples)
            end = min(job.spp, samples + size) if plan is None else _next_end(plan, samples)
            started = time.monotonic()
            await self._pass(prepared, rect, samples, end, acc)
            if plan is None:
                size = pass_size(end - samples, time.monotonic() - started, tuning)
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
        return Finished(samples)

    async def _job_stop(self) -> StopReason | None:
        """One read of the job's row: cancelled, paused or ended (failed for good)?"""
        self._last_read = time.monotonic()
        return control_stop(await self.ctx.db.job_control(self.job.job_id))

    def _stop_reason(self) -> StopReason | None:
        if self.beat.lost.is_set():
            return StopReason.LEASE_LOST
        return self.ctx.stop.reason(self.job.job_id)

    async def _pass(
        self, prepared: Any, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> None:
        # The renderer raises its own Terminal/RetryableError; a timeout cancels its call,
        # and a renderer with a process kills it before the cancellation ends.
        try:
            await asyncio.wait_for(
                self.renderer.render(prepared, rect, start, end, acc),
                self.ctx.worker_config.progress_timeout,
            )
        except TimeoutError:
            raise Stalled(f"samples {start}..{end} made no progress") from None
        samples = (end - start) * (rect[2] - rect[0]) * (rect[3] - rect[1])
        self.ctx.metrics.samples_rendered.inc(samples)


def _next_end(plan: PassPlan, samples: int) -> int:
    """Where the pass starting at ``samples`` ends under a fixed ``plan``."""
    return plan[bisect.bisect_right(plan, samples)]


def pass_size(samples: int, seconds: float, tuning: WorkerSettings) -> int:
    """Samples per pixel of the next pass, after a pass of ``samples`` took ``seconds``.

    Sized from the measured rate to take about ``pass_seconds``: never below
    ``samples_per_pass``, and at most 16 times the last pass, so one fast outlier cannot make a
    pass that outlasts the cancel and checkpoint grain by much. ``seconds`` is wall time on
    the loop (queueing for a kernel thread included), so the estimate errs towards short passes.
    """
    floor = tuning.samples_per_pass
    if tuning.pass_seconds <= 0 or samples <= 0:
        return floor
    if seconds <= 0:
        return max(floor, 16 * samples)
    wanted = int(samples * tuning.pass_seconds / seconds)
    return max(floor, min(wanted, 16 * samples))
