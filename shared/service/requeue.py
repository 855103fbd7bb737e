"""What ``dlq.requeue`` does with one dead letter: decide (:meth:`Requeuer.plan`), then act.

Decisions, from the dead letter's unit and the rows it names (the metadata store decides, not
the letter):

==========  ====================================  ==========================================
unit        rows                                  action
==========  ====================================  ==========================================
``tile-i``  tile dead_lettered / failed_terminal  **requeue**: tile → queued and, if the job
                                                  is dead/failed, job → queued (one
                                                  transaction, generation + 1 each); publish
                                                  the TileMessage under the new generation
                                                  (a moved job's other tiles are requeued
                                                  and unreleased: the dispatcher releases
                                                  them)
``tile-i``  tile queued / failed_retryable, job   **replay**: an earlier requeue moved the rows
            live                                  but its publish or clean-up was cut short;
                                                  publish again under the same generation
``job``,    job dead_lettered / failed_terminal   **requeue**: ``retry_job`` + JobMessage (for
``final``                                         ``final``, every tile is done: the planner
                                                  then hands the job to the finalizer again)
``job``,    job live (not terminal) at            **replay** of that retry's JobMessage: the
``final``   generation > 0                        letter is older than the retry (a job with
                                                  several letters is retried by the first)
anything    otherwise (done, completed,           **skip**, saying why; the letter stays
            cancelled, unknown job, malformed)
==========  ====================================  ==========================================

The letter is deleted from the DLQ stream only **after** the republish was acknowledged, so a
crash in between leaves the letter for the next requeue (which then replays: every message id
is the same, so JetStream absorbs the copy).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from nats.js import api
from nats.js.errors import NotFoundError as JsNotFound

from proto import names as n
from proto.messages import DeadLetter, JobEvent, JobMessage
from shared.core.errors import DecodeError
from shared.core.lifecycle import JobState, TileState, is_terminal
from shared.metadata import Job
from shared.metadata.ops import REQUEUEABLE
from shared.nats.jetstream import publish, retry_transient
from shared.service.announce import announce
from shared.service.deadletter import UNKNOWN_JOB
from shared.service.publish import publish_tiles
from shared.service.runtime import Runtime

__all__ = ["Plan", "Requeuer"]

REQUEUE, REPLAY, SKIP = "requeue", "replay", "skip"
_LIVE_TILE = (TileState.QUEUED, TileState.FAILED_RETRYABLE)
_RETRYABLE_JOB = (JobState.DEAD_LETTERED, JobState.FAILED_TERMINAL)


@dataclass(frozen=True)
class Plan:
    """One dead letter and what requeue does (or, in a dry run, would do) with it."""

    seq: int
    job_id: str
    unit: str
    reason: str
    error: str
    action: str
    why: str
    tile: int | None = None
    #: the generation published (or to be published)
    generation: int | None = None
    done: bool = False

    def view(self) -> dict[str, Any]:
        """The plan as reply fields."""
        return asdict(self)


def _tile_index(unit: str) -> int | None:
    rest = unit.removeprefix("tile-")
    return int(rest) if rest != unit and rest.isdigit() else None


class Requeuer:
    """Plans and applies requeues of dead letters for one service process."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.stream = rt.names.stream(n.STREAM_DLQ)
        self.log = rt.log.bind(component="dlq-requeue")

    async def plan(self, raw: api.RawStreamMsg) -> Plan:
        """Decide what to do with one dead letter; reads only."""
        try:
            letter = DeadLetter.decode(raw.data or b"")
        except DecodeError as exc:
            return Plan(raw.seq or 0, "?", "?", "malformed", str(exc), SKIP, "not a dead letter")
        base = Plan(raw.seq or 0, letter.job_id, letter.unit, letter.reason, letter.error, SKIP,
                    "", tile=_tile_index(letter.unit))  # fmt: skip
        if letter.job_id == UNKNOWN_JOB:
            return replace(base, why="the original message was undecodable: purge it")
        job = await self.rt.db.get_job(letter.job_id)
        if job is None:
            return replace(base, why="the job does not exist")
        if base.tile is not None:
            return await self._plan_tile(base, job, base.tile)
        if letter.unit in (n.DLQ_UNIT_JOB, n.DLQ_UNIT_FINAL):
            return _plan_job(base, job)
        return replace(base, why=f"unknown dead letter unit {letter.unit!r}: purge it")

    async def _plan_tile(self, base: Plan, job: Job, index: int) -> Plan:
        tile = await self.rt.db.get_tile(job.job_id, index)
        if tile is None:
            return replace(base, why=f"tile {index} does not exist")
        state = f"tile {index} is {tile.state.value}, job {job.state.value}"
        if tile.state in REQUEUEABLE and job.state not in (JobState.COMPLETED, JobState.CANCELLED):
            gen = tile.generation + 1
            why = f"{state}: re-render as generation {gen}"
            return replace(base, action=REQUEUE, why=why, generation=gen)
        if tile.state in _LIVE_TILE and not is_terminal(job.state):
            why = f"{state}: already requeued, publish generation {tile.generation} again"
            return replace(base, action=REPLAY, why=why, generation=tile.generation)
        return replace(base, why=f"{state}: nothing to re-render")

    async def apply(self, plan: Plan) -> Plan:
        """Carry out a requeue or replay plan; the letter is deleted after the republish."""
        if plan.action == SKIP:
            return plan
        if plan.tile is not None:
            generation = await self._tile(plan, plan.tile)
        else:
            generation = await self._job(plan)
        await self._delete_letter(plan.seq)
        self.rt.metrics.requeued.labels(unit=self.rt.metrics.dead_letter_unit(plan.unit)).inc()
        self.log.warning("dead letter requeued", job_id=plan.job_id, tile=plan.tile, seq=plan.seq,
                         action=plan.action, generation=generation, reason=plan.reason)  # fmt: skip
        return replace(plan, generation=generation, done=True)

    async def _tile(self, plan: Plan, index: int) -> int:
        db = self.rt.db
        if plan.action == REQUEUE:
            moved = await db.ops.requeue_tile(plan.job_id, index, node=self.rt.node)
            tile, job = moved.tile, moved.job
            if moved.job_requeued:
                await self._announce_retry(job)
        else:
            found = await db.get_tile(plan.job_id, index)
            if found is None:
                raise DecodeError(f"tile {index} of job {plan.job_id} vanished")
            tile = found
        await publish_tiles(self.rt, [tile])
        return tile.generation

    async def _job(self, plan: Plan) -> int:
        db = self.rt.db
        if plan.action == REQUEUE:
            job = await db.retry_job(plan.job_id, node=self.rt.node)
            await self._announce_retry(job)
        else:
            found = await db.get_job(plan.job_id)
            if found is None:
                raise DecodeError(f"job {plan.job_id} vanished")
            job = found
            await self._publish_job(job)
        return job.generation

    async def _announce_retry(self, job: Job) -> None:
        await self._publish_job(job)
        kind = n.EventKind.JOB_RETRIED
        event = JobEvent(job.job_id, kind, job.generation, f"dlq requeue, gen {job.generation}")
        await announce(self.rt, event)

    async def _publish_job(self, job: Job) -> None:
        ack = await publish(
            self.rt.js, self.rt.names.job_subject(job.job_id),
            JobMessage(job.job_id, generation=job.generation),
            msg_id=n.job_msg_id(job.job_id, job.generation),
        )  # fmt: skip
        self.rt.metrics.published(ack)

    async def _delete_letter(self, seq: int) -> None:
        async def attempt(budget: float) -> None:
            try:
                await self.rt.js.delete_msg(self.stream, seq)
            except JsNotFound:
                return  # deleted by a concurrent requeue or purge

        await retry_transient(f"delete dead letter {seq}", attempt, timeout_total=10.0)


def _plan_job(base: Plan, job: Job) -> Plan:
    if job.state in _RETRYABLE_JOB:
        gen = job.generation + 1
        why = f"job is {job.state.value}: retry as generation {gen}"
        return replace(base, action=REQUEUE, why=why, generation=gen)
    if not is_terminal(job.state) and job.generation > 0:
        why = f"job already retried ({job.state.value}): publish generation {job.generation} again"
        return replace(base, action=REPLAY, why=why, generation=job.generation)
    return replace(base, why=f"job is {job.state.value}: nothing to retry")
