"""Finalization of one job (DESIGN.md "Finalizer flow").

Take the ``final.<job>`` lease, mark the job ``finalizing``, assemble the committed tile
results (each verified against its recorded sha256; their images converted when read ahead,
or now) into the frame's float32 mean and display image, encode the PNG and the float image,
publish both under content-addressed keys and verify the PNG by reading it back, then set
``completed`` + ``result_location`` + ``result_sha256`` in one transaction and announce it. The
kernel is deterministic, so racing finalizers write the same bytes under the same key; readers
trust only ``result_location``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

import kernel.image  # numpy and isal load at start-up, not in the first finalization
from kernel.rect import Rect
from proto import names as n
from proto.messages import JobEvent, TileDone, TilesDone
from services.finalizer.cache import Images, ReadAhead, Result
from shared.core import crash
from shared.core.errors import DecodeError, RetryableError, TerminalError
from shared.core.lifecycle import IllegalTransition, JobState, JobTrigger
from shared.core.tiles import Accumulator, assemble, fits, from_npy, load_npy
from shared.metadata import Job, TileResultRef
from shared.nats.leases import LeaseOwner
from shared.objectstore import render_key, sha256_hex
from shared.service.announce import announce, fail_job
from shared.service.heartbeat import Heartbeat
from shared.service.logs import Log
from shared.service.runtime import Runtime
from shared.service.settle import (
    ACK,
    DeadLetter,
    Delivery,
    Outcome,
    Retry,
    outcome_of,
    settle,
)
from shared.service.tileresults import ResultMissing, committed_results, inline_result

__all__ = ["Finalizer", "ImageCorrupt", "ResultLost"]

#: requests to the object store open at once while assembling
_READS_IN_FLIGHT = 16
#: tile results read before they are parsed and their bytes dropped
_READ_BATCH = 64
#: jobs whose samples and renderer the read-ahead remembers
_KINDS_HELD = 1024

_SETTLED = frozenset(
    {JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED_TERMINAL, JobState.DEAD_LETTERED}
)


class ResultLost(Exception):
    """Committed tile results are missing or corrupt: those tiles must be rendered again."""

    def __init__(self, tiles: dict[int, str]) -> None:
        self.tiles = tiles
        super().__init__("; ".join(f"tile {i}: {why}" for i, why in sorted(tiles.items())))


class ImageCorrupt(RetryableError):
    """The published image did not read back with its checksum."""

    code = "image_corrupt"


class Finalizer:
    """Handles tiles-done events (and reads tile results ahead from the tile-done events)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="finalizer")
        self.read_ahead = ReadAhead(rt.settings.finalizer.read_ahead_bytes)
        #: job id -> (spp, display-referred) of the jobs read ahead lately (immutable facts)
        self._kinds: dict[str, tuple[int, bool]] = {}

    @property
    def reads_ahead(self) -> bool:
        """Whether this finalizer reads results ahead: with a budget, from a remote store only.

        The read-ahead hides the store's latency at finalization. A directory store's reads
        are local (page cache), so there it would save the tail little and cost a wake-up of
        the finalizer per tile on the cores it shares: (a)'s jobs side by side with and without
        the subscription (as ``bench.coordination`` runs them), finalizer 1.66 → 1.01 core-ms and
        NATS 2.72 → 2.53 per tile, the job's wall time no longer (docs/architecture.md,
        "Finalizer flow").
        """
        return self.read_ahead.budget > 0 and self.rt.store.remote

    async def subscribe_read_ahead(self) -> Subscription:
        """The read-ahead's plain subscription to every tile-done event, shared by the
        finalizers in one queue group (each result is read ahead by one of them). Best effort:
        an event it misses (a finalizer down, a slow consumer) is read at finalization."""
        sub = await self.rt.nc.subscribe(
            self.rt.names.tile_done_filter, queue=self.rt.names.read_ahead_group,
            cb=self._on_tile_done,
        )  # fmt: skip
        await self.rt.nc.flush()  # the server has it: the events from now on are delivered
        return sub

    async def _on_tile_done(self, msg: Msg) -> None:
        try:
            done = TileDone.decode(msg.data)
        except DecodeError as exc:
            self.log.debug("read-ahead: undecodable tile-done event", error=str(exc))
            return
        await self.read_ahead_result(done)

    async def handle(self, msg: Msg) -> None:
        """One tiles-done event: finalize its job; ack last."""
        delivery = Delivery.of(self.rt, msg)
        await settle(delivery, await self.outcome(delivery))

    async def outcome(self, delivery: Delivery) -> Outcome:
        """Handle the delivered tiles-done event; what to do with it."""
        try:
            done = TilesDone.decode(delivery.data)
        except DecodeError as exc:
            return DeadLetter(None, n.DLQ_UNIT_FINAL, exc)
        try:
            finished = await self.finalize(done.job_id, delivery)
        except (RetryableError, TerminalError) as exc:
            return self._failed(done.job_id, exc, delivery)
        # Not finished: another finalizer is at it; look again after its lease TTL.
        return ACK if finished else Retry(float(self.rt.settings.leases.ttl))

    def _failed(
        self, job_id: str, exc: RetryableError | TerminalError, delivery: Delivery
    ) -> Outcome:
        outcome = outcome_of(exc, retry=self.rt.retry, deliveries=delivery.deliveries,
                             job_id=job_id, unit=n.DLQ_UNIT_FINAL)  # fmt: skip
        failures = self.rt.metrics.finalization_failures
        if isinstance(exc, IllegalTransition):  # cancelled or failed meanwhile: nothing to do
            self.log.info("job no longer finalizable", job_id=job_id, error=str(exc))
        elif isinstance(outcome, Retry):
            failures.labels(kind="retryable").inc()
            self.rt.metrics.retries.labels(code=exc.code).inc()
            self.log.warning("finalization failed; will retry", job_id=job_id, error=str(exc))
        elif isinstance(outcome, DeadLetter):
            failures.labels(kind="terminal").inc()
            self.log.error("finalization failed for good", job_id=job_id, error=str(exc))

            async def record() -> None:
                await fail_job(self.rt, job_id, JobTrigger.TERMINAL_FAILURE, code=exc.code,
                               error=str(exc), log=self.log)  # fmt: skip

            outcome = replace(outcome, record=record)
        return outcome

    async def read_ahead_result(self, done: TileDone) -> None:
        """Read the event's result object now, while other tiles still render (best effort).

        An inline result (no key) is not read here: finalization reads all of those in one
        query. A failure is only a miss: finalization reads the object again.
        """
        key = done.result_key
        if not key or self.read_ahead.budget <= 0:
            return
        if self.read_ahead.has(done.job_id, done.tile_index):
            return
        try:
            data = await self.rt.store.get(key)
            acc = load_npy(data)
            kind = await self._kind(done.job_id)
        except (RetryableError, TerminalError) as exc:  # (a DecodeError is terminal)
            self.log.debug("read-ahead missed", job_id=done.job_id, key=key, error=str(exc))
            return
        images = None if kind is None else await asyncio.to_thread(_convert, acc, *kind)
        self.read_ahead.put(
            done.job_id, done.tile_index, Result(key, sha256_hex(data), acc, images)
        )
        self.rt.metrics.read_ahead_bytes.set(self.read_ahead.bytes)

    async def _kind(self, job_id: str) -> tuple[int, bool] | None:
        """The job's samples per pixel and whether its renderer is display-referred (what a
        tile's images depend on), read once per job; None for a job not found."""
        kind = self._kinds.get(job_id)
        if kind is None:
            job = await self.rt.db.get_job(job_id)
            if job is None:
                return None
            kind = (job.spp, job.renderer in n.DISPLAY_REFERRED_RENDERERS)
            self._kinds[job_id] = kind
            while len(self._kinds) > _KINDS_HELD:
                del self._kinds[next(iter(self._kinds))]
        return kind

    def _take_held(self, job_id: str) -> dict[int, Result]:
        """The job's read-ahead results, no longer held (the gauge follows)."""
        held = self.read_ahead.take(job_id)
        self.rt.metrics.read_ahead_bytes.set(self.read_ahead.bytes)
        return held

    async def finalize(self, job_id: str, delivery: Delivery | None) -> bool:
        """Finalize ``job_id`` if it is ready; False when another finalizer holds its lease
        (the message must be retried later). ``delivery`` is kept alive while it works."""
        db = self.rt.db
        # The cheap question first (the job row carries the whole scene document). Not ready:
        # an event of an older completion (tiles sent back to rendering since); the next
        # completion announces itself.
        if not await db.all_tiles_done(job_id):
            return True
        job = await db.get_job(job_id)
        if job is None or job.state in _SETTLED:
            self._take_held(job_id)
            return True
        attempt_id = n.new_attempt_id()
        owner = LeaseOwner(node=self.rt.node, attempt_id=attempt_id)
        lease = await self.rt.leases.acquire(n.lease_key_final(job_id), owner)
        if lease is None:
            return False
        tuning = self.rt.settings.leases
        log = self.log.bind(job_id=job_id, attempt_id=attempt_id)
        beat = Heartbeat(self.rt.leases, lease, delivery, tuning.heartbeat_interval, log).start()
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

    async def _publish(self, job: Job, attempt_id: str, log: Log) -> None:
        db, store, node = self.rt.db, self.rt.store, self.rt.node
        job = await db.transition_job(
            job.job_id, JobTrigger.ALL_TILES_DONE, node=node, attempt_id=attempt_id
        )
        if job.state is JobState.COMPLETED:
            return
        crash.crash_point("finalizer.after_finalizing")
        try:
            mean, image = await self._assemble(job)
        except ResultLost as lost:
            await self._render_again(job, attempt_id, lost, log)
            return

        encode = kernel.image.png16_of if _display_referred(job) else kernel.image.png_of

        async def write_float() -> str:
            flt, sha = await asyncio.to_thread(_float_image, mean)
            key = render_key(job.job_id, sha, "npy")
            await store.put(key, flt, sha256=sha)
            return key

        async def write_png() -> tuple[str, str]:
            png, sha = await asyncio.to_thread(_png_image, encode, image)
            key = render_key(job.job_id, sha, "png")
            await store.put(key, png, sha256=sha)
            try:
                await store.get(key, sha256=sha)
            except (TerminalError, RetryableError) as exc:
                raise ImageCorrupt(f"{key} did not read back intact: {exc}") from exc
            return key, sha

        # The PNG is encoded, written and read back on one core while the float image is
        # serialized, hashed and written; both end (written or failed) before either failure
        # is raised.
        png, float_key = await asyncio.gather(write_png(), write_float(), return_exceptions=True)
        if isinstance(png, BaseException):
            raise png
        if isinstance(float_key, BaseException):
            raise float_key
        png_key, png_sha = png
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

    async def _assemble(self, job: Job) -> tuple[np.ndarray, np.ndarray]:
        """Every committed tile result, verified against its recorded sha256, in the job's
        float32 mean and display image (:func:`kernel.image.display_images`).

        Small results come inline from the database in one query; results read ahead are used
        as held when the row names the same key and sha256 and the shape fits, with the images
        converted when they were read if those were for this job's samples and renderer; the
        rest are read :data:`_READ_BATCH` at a time
        (:meth:`~shared.objectstore.ObjectStore.get_many`: at most :data:`_READS_IN_FLIGHT`
        requests open; the directory store reads them in one thread call per core) and converted
        here.
        """
        tiles = await self.rt.db.result_refs(job.job_id)
        inline = await self.rt.db.tile_results(job.job_id)
        ahead = self._take_held(job.job_id)
        kind = (job.spp, _display_referred(job))
        lost: dict[int, str] = {}
        parts: list[tuple[Rect, Accumulator | Images]] = []
        to_read: list[TileResultRef] = []
        for t in tiles:
            held = ahead.get(t.tile_index)
            if (
                held is not None
                and (held.key, held.sha256) == (t.result_key, t.result_sha256)
                and fits(held.acc, t.rect)
            ):
                # read ahead, and it is what the row names
                images = held.images
                fresh = images is not None and (images.samples, images.display_referred) == kind
                parts.append((t.rect, images if fresh and images is not None else held.acc))
            elif t.result_key:
                to_read.append(t)
            else:  # inline: no task per tile (an 8x8-tiled frame has thousands)
                try:
                    parts.append((t.rect, from_npy(inline_result(t, inline), t.rect)))
                except ResultMissing as exc:
                    lost[t.tile_index] = str(exc)

        # A batch of reads at a time: their bytes are dropped once parsed, so a large frame
        # holds the raw bytes of one batch beside its accumulators, not of every tile.
        for first in range(0, len(to_read), _READ_BATCH):
            batch = to_read[first : first + _READ_BATCH]
            read = await committed_results(self.rt.store, batch, inline, in_flight=_READS_IN_FLIGHT)
            for t, got in zip(batch, read, strict=True):
                if isinstance(got, ResultMissing):
                    lost[t.tile_index] = str(got)
                else:
                    parts.append((t.rect, from_npy(got, t.rect)))
            del read
        if lost:
            raise ResultLost(lost)
        sources = self.rt.metrics.final_results
        from_store = len(to_read)
        from_inline = sum(1 for t in tiles if not t.result_key)
        sources.labels(source="read_ahead").inc(len(tiles) - from_store - from_inline)
        sources.labels(source="store").inc(from_store)
        sources.labels(source="inline").inc(from_inline)
        return await asyncio.to_thread(_frames, job.width, job.height, kind, parts)

    async def _render_again(self, job: Job, attempt_id: str, lost: ResultLost, log: Log) -> None:
        """Send the tiles whose results are lost back to rendering; the job leaves finalizing.

        The kernel is deterministic, so a re-rendered tile commits the same bytes; the sweeper
        re-publishes the tiles (no message, no lease) and their tile-done events finalize the job.
        """
        error = str(lost)[:4000]
        moved = await self.rt.db.result_lost(
            job.job_id, sorted(lost.tiles), error=error, node=self.rt.node, attempt_id=attempt_id
        )
        await self.rt.db.end_attempt(
            attempt_id, outcome="retryable", error_code="result_lost", error=error
        )
        self.rt.metrics.finalization_failures.labels(kind="result_lost").inc()
        log.warning("tile results lost; rendering those tiles again", tiles=moved, error=error)


def _display_referred(job: Job) -> bool:
    """``tessera`` and ``blender`` accumulate linear radiance: the float image is the mean
    (Blender's own float32 render value for value, for one pass per tile) and the PNG
    Tessera's tone map of it (smallpt's gamma 2.2, not Blender's view transform). ``povray``
    accumulates POV-Ray's own gamma-encoded 16-bit values: no tone curve, the PNG is 16-bit and
    equals ``povray +FN16``'s image pixel for pixel."""
    return job.renderer in n.DISPLAY_REFERRED_RENDERERS


def _convert(acc: Accumulator, samples: int, display_referred: bool) -> Images:
    mean, image = kernel.image.display_images(acc, samples, display_referred=display_referred)
    return Images(samples, display_referred, mean, image)


def _frames(
    width: int, height: int, kind: tuple[int, bool], parts: list[tuple[Rect, Accumulator | Images]]
) -> tuple[np.ndarray, np.ndarray]:
    """The frame's float32 mean and display image from its tiles' (converted
    here where a part is still an accumulator; per element, so the same bits as converting
    the frame).

    Accumulators covering half the frame or more (small inline tiles, nothing read ahead)
    are placed in one frame and converted at once: a conversion per 8x8 tile costs 5x the
    frame's in numpy's per-call overhead. Fewer (read-ahead misses) are converted apart.
    """
    samples, display_referred = kind
    accs: list[tuple[Rect, Accumulator]] = []
    held: list[tuple[Rect, Accumulator | Images]] = []
    for rect, part in parts:
        if isinstance(part, Images):
            held.append((rect, part))
        else:
            accs.append((rect, part))
    area = sum((x1 - x0) * (y1 - y0) for (x0, y0, x1, y1), _ in accs)
    if 2 * area >= width * height:
        whole = _convert(assemble(width, height, accs), samples, display_referred)
        mean, image = whole.mean, whole.image
        parts = held
    else:
        mean = np.empty((height, width, 3), dtype=np.float32)
        image = np.empty((height, width, 3), dtype=np.uint16 if display_referred else np.uint8)
    for (x0, y0, x1, y1), part in parts:
        images = part if isinstance(part, Images) else _convert(part, samples, display_referred)
        mean[y0:y1, x0:x1] = images.mean
        image[y0:y1, x0:x1] = images.image
    return mean, image


def _float_image(mean: np.ndarray) -> tuple[bytes, str]:
    """The float image's ``.npy`` bytes and their sha256 (in a thread, beside the PNG's encode)."""
    flt = kernel.image.float_npy(mean)
    return flt, _sha(flt)


def _png_image(encode: Callable[[np.ndarray], bytes], image: np.ndarray) -> tuple[bytes, str]:
    """The PNG's bytes and their sha256 (in a thread, beside the float image's)."""
    png = encode(image)
    return png, _sha(png)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
