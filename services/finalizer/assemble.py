"""Finalization of one job (DESIGN.md "Finalizer flow").

Take the ``final.<job>`` lease, mark the job ``finalizing``, assemble the committed tile
accumulators (each verified against its recorded sha256), encode the PNG and the float image,
publish both under content-addressed keys and verify the PNG by reading it back, then set
``completed`` + ``result_location`` + ``result_sha256`` in one transaction and announce it. The
kernel is deterministic, so racing finalizers write the same bytes under the same key; readers
trust only ``result_location``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid

from nats.aio.msg import Msg

import kernel
from proto import names as n
from proto.messages import JobEvent, TileDone
from services.announce import announce
from services.deadletter import dead_letter
from services.worker.heartbeat import Heartbeat
from shared import crash
from shared.errors import DecodeError, RetryableError, TerminalError
from shared.jetstream import ack_sync_retry
from shared.leases import LeaseOwner
from shared.lifecycle import IllegalTransition, JobState, JobTrigger
from shared.metadata import Job
from shared.objectstore import render_key
from shared.retry import backoff
from shared.runtime import Runtime
from shared.tiles import Accumulator, assemble, from_npy

__all__ = ["Finalizer", "ImageCorrupt"]

_SETTLED = frozenset(
    {JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED_TERMINAL, JobState.DEAD_LETTERED}
)


class ImageCorrupt(RetryableError):
    """The published image did not read back with its checksum."""

    code = "image_corrupt"


class Finalizer:
    """Handles tile-done events."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="finalizer")

    async def handle(self, msg: Msg) -> None:
        """One tile-done event: finalize its job if every tile is done; ack last."""
        try:
            done = TileDone.decode(msg.data)
        except DecodeError as exc:
            await dead_letter(self.rt, msg, job_id=None, unit=n.DLQ_UNIT_FINAL, error=exc)
            await msg.term()
            return
        try:
            settled = await self.finalize(done.job_id, msg)
        except IllegalTransition as exc:  # cancelled or failed meanwhile: nothing to publish
            self.log.info("job no longer finalizable", job_id=done.job_id, error=str(exc))
            settled = True
        except RetryableError as exc:
            self.rt.metrics.finalization_failures.labels(kind="retryable").inc()
            self.rt.metrics.retries.labels(code=exc.code).inc()
            delay = backoff(self.rt.retry, msg.metadata.num_delivered)
            self.log.warning("finalization failed; will retry", job_id=done.job_id, error=str(exc))
            await msg.nak(delay=delay)
            return
        except TerminalError as exc:
            self.rt.metrics.finalization_failures.labels(kind="terminal").inc()
            self.log.error("finalization failed for good", job_id=done.job_id, error=str(exc))
            await dead_letter(self.rt, msg, job_id=done.job_id, unit=n.DLQ_UNIT_FINAL, error=exc)
            await self._fail(done.job_id, exc)
            await msg.term()
            return
        if settled:
            await ack_sync_retry(msg)

    async def finalize(self, job_id: str, msg: Msg | None) -> bool:
        """Finalize ``job_id`` if it is ready; False when the message must be retried later."""
        db = self.rt.db
        # The cheap question first: most tile-done events arrive while other tiles still run,
        # and the job row carries the whole scene document.
        if not await db.all_tiles_done(job_id):
            return True  # nothing to do now; the last tile's event will come
        job = await db.get_job(job_id)
        if job is None or job.state in _SETTLED:
            return True
        attempt_id = uuid.uuid4().hex
        owner = LeaseOwner(node=self.rt.node, attempt_id=attempt_id)
        lease = await self.rt.leases.acquire(n.lease_key_final(job_id), owner)
        if lease is None:
            if msg is not None:  # another finalizer is at it; look again after its lease TTL
                await msg.nak(delay=float(self.rt.settings.tuning.lease_ttl))
            return False
        tuning = self.rt.settings.tuning
        log = self.log.bind(job_id=job_id, attempt_id=attempt_id)
        beat = Heartbeat(self.rt.leases, lease, msg, tuning.heartbeat_interval, log).start()
        started = time.monotonic()
        try:
            await db.start_final_attempt(job_id, attempt_id=attempt_id, node=self.rt.node,
                                         fence=lease.token)  # fmt: skip
            await self._publish(job, attempt_id, log)
        finally:
            await self.rt.leases.release(await beat.stop())
            if beat.lost.is_set():
                self.rt.metrics.lease_renewal_failures.labels(kind="final").inc()
        self.rt.metrics.final_seconds.observe(time.monotonic() - started)
        return True

    async def _publish(self, job: Job, attempt_id: str, log: object) -> None:
        db, store, node = self.rt.db, self.rt.store, self.rt.node
        job = await db.transition_job(
            job.job_id, JobTrigger.ALL_TILES_DONE, node=node, attempt_id=attempt_id
        )
        if job.state is JobState.COMPLETED:
            return
        crash.crash_point("finalizer.after_finalizing")
        acc = await self._assemble(job)
        png, flt = await asyncio.to_thread(_encode, acc, job.spp)
        png_sha, flt_sha = _sha(png), _sha(flt)
        float_key = render_key(job.job_id, flt_sha, "npy")
        png_key = render_key(job.job_id, png_sha, "png")
        await store.put(float_key, flt)
        await store.put(png_key, png)
        try:
            await store.get(png_key, sha256=png_sha)
        except (TerminalError, RetryableError) as exc:
            raise ImageCorrupt(f"{png_key} did not read back intact: {exc}") from exc
        crash.crash_point("finalizer.after_image_write")
        job = await db.complete_job(
            job.job_id,
            result_location=png_key,
            result_sha256=png_sha,
            float_location=float_key,
            node=node,
            attempt_id=attempt_id,
        )
        await announce(self.rt, JobEvent(job.job_id, n.EventKind.JOB_COMPLETED,
                                           job.generation, png_sha, png_key))  # fmt: skip
        crash.crash_point("finalizer.after_complete")
        await db.end_attempt(attempt_id, outcome="done")
        self._completed(job)
        self.rt.log.info("job completed", job_id=job.job_id, attempt_id=attempt_id,
                         result=png_key, sha256=png_sha)  # fmt: skip

    def _completed(self, job: Job) -> None:
        self.rt.metrics.jobs_completed.inc()
        if job.finished_at is not None:
            seconds = (job.finished_at - job.created_at).total_seconds()
            self.rt.metrics.job_seconds.observe(max(seconds, 0.0))

    async def _assemble(self, job: Job) -> Accumulator:
        tiles = await self.rt.db.list_tiles(job.job_id)
        parts = []
        for t in tiles:
            if not t.result_key or not t.result_sha256:
                raise TerminalError(f"tile {t.tile_index} is done but names no result")
            data = await self.rt.store.get(t.result_key, sha256=t.result_sha256)
            rect = (t.x0, t.y0, t.x1, t.y1)
            parts.append((rect, from_npy(data, rect)))
        return assemble(job.width, job.height, parts)

    async def _fail(self, job_id: str, exc: TerminalError) -> None:
        job = await self.rt.db.transition_job(
            job_id, JobTrigger.TERMINAL_FAILURE, node=self.rt.node, error_code=exc.code,
            error=str(exc),
        )  # fmt: skip
        await announce(self.rt, JobEvent(job_id, n.EventKind.JOB_FAILED, job.generation,
                                           str(exc)[:4000]))  # fmt: skip


def _encode(acc: Accumulator, spp: int) -> tuple[bytes, bytes]:
    return kernel.encode_png(acc, spp), kernel.encode_float_image(acc, spp)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
