"""JOBS → tile plan (rows only): idempotent under redelivery.

The planner writes a job's tile rows, unreleased (``published_at`` NULL), and wakes the
dispatcher (:mod:`services.scheduler.dispatch`), which releases them into ``TILES`` as workers
have room. A redelivered ``JobMessage`` plans the same tiles again (rows are inserted ``ON
CONFLICT DO NOTHING``) and changes nothing; a crash after the rows (``scheduler.after_plan``)
leaves them for any dispatcher's next round.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.msg import Msg

from proto import names as n
from proto.limits import AUTO_TILE_STEP, auto_tile_edge
from proto.messages import JobMessage
from proto.povray import BLOCK as POVRAY_BLOCK
from shared.core import crash
from shared.core.errors import RetryableError, TerminalError
from shared.core.lifecycle import IllegalTransition, TileState, is_terminal
from shared.core.tiles import plan_rects
from shared.metadata import Job
from shared.nats.presence import LiveWorkers, capacity
from shared.service.announce import announce_completion
from shared.service.runtime import Runtime
from shared.service.settle import ACK, Delivery, Outcome, Retry, outcome_of, settle

__all__ = ["Planner"]

_DONE_OR_TERMINAL = frozenset({TileState.DONE, TileState.FAILED_TERMINAL, TileState.DEAD_LETTERED})


def _nothing() -> None:
    return None


class Planner:
    """Handles ``JOBS`` messages."""

    def __init__(self, rt: Runtime, *, on_planned: Callable[[], None] = _nothing) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="planner")
        #: called after a plan with tiles to render (the dispatcher's nudge)
        self.on_planned = on_planned
        #: the live workers (an auto job's tiles are sized so each of their threads has one)
        self.workers = LiveWorkers(rt.js, rt.names.bucket(n.BUCKET_WORKERS))

    async def handle(self, msg: Msg) -> None:
        """Plan one job, ack last."""
        delivery = Delivery.of(self.rt, msg)
        await settle(delivery, await self.outcome(delivery))

    async def outcome(self, delivery: Delivery) -> Outcome:
        """Plan the delivered job; what to do with its message."""
        try:
            await self.plan(JobMessage.decode(delivery.data))
        except (RetryableError, TerminalError) as exc:
            outcome = outcome_of(exc, retry=self.rt.retry, deliveries=delivery.deliveries,
                                 job_id=None, unit=n.DLQ_UNIT_JOB)  # fmt: skip
            if isinstance(exc, IllegalTransition):  # the job moved on (cancelled, failed)
                self.log.info("job no longer plannable", error=str(exc))
            elif isinstance(outcome, Retry):
                self.log.warning("planning failed; will retry", error=str(exc),
                                 delay=outcome.delay)  # fmt: skip
            return outcome
        return ACK

    async def plan(self, job_msg: JobMessage) -> None:
        """Write the tile rows of a job (unreleased) and wake the dispatcher."""
        db = self.rt.db
        job = await db.get_job(job_msg.job_id)
        if job is None or is_terminal(job.state) or job.cancel_requested:
            self.log.info("nothing to plan", job_id=job_msg.job_id)
            return
        if job_msg.generation < job.generation:
            self.log.info("stale job generation", job_id=job.job_id, got=job_msg.generation)
            return
        edge = job.tile_size or await self.auto_edge(job)
        rects = plan_rects(job.width, job.height, edge)
        chosen = edge if job.tile_auto else None
        tiles = await db.plan_tiles(job.job_id, rects, node=self.rt.node, tile_size=chosen)
        crash.crash_point("scheduler.after_plan")
        todo = [t for t in tiles if t.state not in _DONE_OR_TERMINAL]
        if todo:
            self.on_planned()
        if tiles and all(t.state is TileState.DONE for t in tiles):
            await self._finalize_again(job_msg, max(t.lease_fence for t in tiles))
        self.log.info("planned", job_id=job.job_id, tiles=len(tiles), to_render=len(todo))

    async def auto_edge(self, job: Job) -> int:
        """The edge of a ``tile_size: "auto"`` job: a tile takes about ``TESSERA_TILE_SECONDS``
        on one core at the measured cost of its scene (or renderer; else ``TESSERA_TILE_COST``),
        and every live kernel thread of its renderer gets a tile (:func:`auto_tile_edge`)."""
        config = self.rt.settings.scheduler
        estimate = await self.rt.db.tile_cost(job.job_id, job.cost_key, job.renderer)
        cost = config.tile_cost if estimate is None else estimate.seconds_per_sample
        threads = await self._threads(job.renderer)
        step = POVRAY_BLOCK if job.renderer == "povray" else AUTO_TILE_STEP
        edge = auto_tile_edge(job.width, job.height, job.spp, seconds_per_sample=cost,
                              target_seconds=config.tile_seconds, threads=threads,
                              step=step)  # fmt: skip
        self.log.info("auto tile edge", job_id=job.job_id, edge=edge, threads=threads,
                      seconds_per_sample=cost,
                      measured_over=0 if estimate is None else estimate.attempts,
                      scope="default" if estimate is None else estimate.scope)  # fmt: skip
        return edge

    async def _threads(self, renderer: str) -> int:
        """Kernel threads of the live workers announcing ``renderer`` (1 if none or unknown:
        the bucket cannot be read, or no worker is up yet)."""
        try:
            live = await self.workers.list()
        except (RetryableError, TerminalError) as exc:
            self.log.warning(
                "live workers unreadable; auto tiles assume one thread", error=str(exc)
            )
            return 1
        return max(1, capacity(live, 1.0).get(renderer, 0))

    async def _finalize_again(self, job_msg: JobMessage, completion: int) -> None:
        """Every tile is already done (a retried job whose finalization failed): hand the job
        to the finalizer again with a tiles-done event of this job generation (``completion``:
        the newest fence among its tiles)."""
        await announce_completion(
            self.rt, job_msg.job_id, completion, id_suffix=f":gen{job_msg.generation}"
        )
