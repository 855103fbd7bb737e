"""MAX_DELIVERIES advisories → dead letters.

JetStream stops redelivering a message after ``max_deliver`` attempts and emits an advisory
(lazily, and only to live subscribers — so the ADVISORIES stream captures them). For each one the
scheduler copies the original message to the DLQ with the last recorded error, deletes it from
its work-queue stream, and dead-letters the tile and its job. Every step is idempotent, so an
advisory redelivered after a crash repeats nothing visible.
"""

from __future__ import annotations

import orjson
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from proto.messages import JobMessage, TileDone, TileMessage, TilesDone
from shared.core.errors import DecodeError, RetryableError
from shared.core.lifecycle import JobTrigger, TileTrigger, is_terminal
from shared.metadata import AttemptOutcome
from shared.service.announce import fail_job
from shared.service.deadletter import dead_letter_raw
from shared.service.runtime import Runtime
from shared.service.settle import ACK, Delivery, Outcome, outcome_of, settle

__all__ = ["Exhausted"]

REASON = "max_deliveries"


class Exhausted:
    """Handles captured MAX_DELIVERIES advisories."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="dead-letter")
        names = rt.names
        self.tiles = names.stream(n.STREAM_TILES)
        self.jobs = names.stream(n.STREAM_JOBS)
        self.events = names.stream(n.STREAM_EVENTS)

    async def handle(self, msg: Msg) -> None:
        """Dead-letter the message an advisory names; ack last."""
        delivery = Delivery.of(self.rt, msg)
        await settle(delivery, await self.outcome(delivery))

    async def outcome(self, delivery: Delivery) -> Outcome:
        """Handle the delivered advisory; what to do with it."""
        try:
            advisory = orjson.loads(delivery.data)
            stream, seq = str(advisory["stream"]), int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries", 0))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            self.log.error("unreadable advisory dropped", data=delivery.data[:200])
            return ACK
        try:
            await self.exhausted(stream, seq, deliveries)
        except RetryableError as exc:
            self.log.warning("dead-lettering failed; will retry", error=str(exc))
            return outcome_of(exc, retry=self.rt.retry, deliveries=delivery.deliveries,
                              job_id=None, unit=n.DLQ_UNIT_JOB)  # fmt: skip
        return ACK

    async def exhausted(self, stream: str, seq: int, deliveries: int) -> None:
        """Copy message ``seq`` of ``stream`` to the DLQ and fail what it stood for."""
        try:
            raw = await self.rt.js.get_msg(stream, seq)
        except StreamMsgNotFound:
            return  # already handled (copied and deleted) before a crash
        job_id, tile_index, unit = self._identify(stream, raw.data or b"")
        error = await self._last_error(job_id, tile_index, deliveries)
        await dead_letter_raw(
            self.rt,
            job_id=job_id,
            unit=unit,
            reason=REASON,
            error=error,
            stream=stream,
            seq=seq,
            deliveries=deliveries,
            subject=raw.subject or "",
            payload=raw.data or b"",
        )
        if stream in (self.tiles, self.jobs):
            await self.rt.js.delete_msg(stream, seq)
        if job_id is not None:
            await self._fail(job_id, tile_index, error)

    def _identify(self, stream: str, data: bytes) -> tuple[str | None, int | None, str]:
        try:
            if stream == self.tiles:
                tile = TileMessage.decode(data)
                return tile.job_id, tile.tile_index, n.dlq_unit_tile(tile.tile_index)
            if stream == self.events:  # the finalizer's consumer reads tiles-done events
                return _event_job(data), None, n.DLQ_UNIT_FINAL
            return JobMessage.decode(data).job_id, None, n.DLQ_UNIT_JOB
        except DecodeError:
            return None, None, n.DLQ_UNIT_JOB

    async def _last_error(self, job_id: str | None, tile_index: int | None, count: int) -> str:
        default = f"delivered {count} times without success"
        if job_id is None or tile_index is None:
            return default
        tile = await self.rt.db.get_tile(job_id, tile_index)
        if tile is None or not tile.last_error:
            return default
        return f"{default}; last error [{tile.last_error_code}]: {tile.last_error}"

    async def _fail(self, job_id: str, tile_index: int | None, error: str) -> None:
        db, node = self.rt.db, self.rt.node
        if tile_index is not None:
            await db.fail_tile(
                job_id,
                tile_index,
                token=None,
                attempt_id=None,
                trigger=TileTrigger.DEAD_LETTER,
                error_code=REASON,
                error=error,
                node=node,
                outcome=AttemptOutcome.TERMINAL,  # no attempt to close: the worker died
            )
        job = await db.get_job(job_id)
        if job is None or is_terminal(job.state):
            return
        await fail_job(self.rt, job_id, JobTrigger.DEAD_LETTER, code=REASON, error=error,
                       log=self.log)  # fmt: skip


def _event_job(data: bytes) -> str:
    """The job of an exhausted finalizer event: a tiles-done event, or a tile-done event the
    consumer read before it was filtered to tiles-done (a deployment upgraded mid-job)."""
    try:
        return TilesDone.decode(data).job_id
    except DecodeError:
        return TileDone.decode(data).job_id
