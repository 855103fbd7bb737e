"""One tile's checkpoints: where to resume, loading, writing, clean-up.

A checkpoint is the tile's float64 accumulator after ``samples`` per pixel, written under a key
of its own (``checkpoints/<job>/<tile>/<attempt>-<samples>.npy``, never overwritten), then
named by the tile's progress pointer (KV, compare-and-set, carrying ``input_hash``), then
recorded in the tile row under the owner's fence. The pointer's ``input_hash`` is
:func:`kernel.hashing.checkpoint_hash` of the job's input hash and the renderer's name and
version. A resume trusts the pointer only if that hash is the one this worker's renderer would
write, the samples it records end a pass of the renderer's fixed pass plan (if it has one) and
the object it names loads with the tile's shape; anything else starts from zero. Because every
key is written once, a crash between the object and the pointer leaves the pointer naming
exactly the bytes of the samples it records.
"""

from __future__ import annotations

from kernel.hashing import checkpoint_hash
from kernel.rect import Rect
from proto import names as n
from services.worker.context import TileContext
from services.worker.renderers import Renderer
from shared.core import crash
from shared.core.errors import DecodeError, NotFoundError, RetryableError, TerminalError
from shared.core.tiles import Accumulator, from_npy, to_npy, zeros_for
from shared.metadata import Job, Tile
from shared.nats.leases import ProgressPointer
from shared.objectstore import CorruptObject, checkpoint_key
from shared.service.logs import Log

__all__ = ["Checkpoints"]


class Checkpoints:
    """Checkpoints of one tile by one attempt.

    It alone keeps where they are (the pointer's revision, the latest checkpoint's key); the
    tile run passes the samples it has reached and reads :attr:`resumed_from`.
    """

    def __init__(
        self, ctx: TileContext, job: Job, tile: Tile, attempt_id: str, log: Log, renderer: Renderer
    ) -> None:
        self.ctx, self.job, self.tile, self.attempt_id, self.log = ctx, job, tile, attempt_id, log
        self.rect: Rect = tile.rect
        #: what this worker's pointers carry, and what a resumable pointer must carry
        self.input_hash = checkpoint_hash(job.input_hash, renderer.name, renderer.version)
        self._plan = renderer.passes(job)
        self.pointer_key = n.progress_key(job.job_id, tile.tile_index)
        #: samples per pixel the attempt resumes from (0: from the start)
        self.resumed_from = 0
        #: samples per pixel of the latest checkpoint (the resume, or our last write)
        self.latest = 0
        self._revision: int | None = None  # the pointer's, the CAS base of our next write
        self._checkpoint: str | None = None  # the latest checkpoint's key

    async def resume(self) -> Accumulator:
        """The accumulator to continue from: the pointer's checkpoint, or zeros.

        A tile never leased has no checkpoint; a pointer of other inputs, or one naming an
        object that does not load with the tile's shape, is a start from zero.
        """
        await self._read_pointer()
        if self._checkpoint is None:
            return zeros_for(self.rect)
        try:
            return from_npy(await self.ctx.store.get(self._checkpoint), self.rect)
        except (NotFoundError, DecodeError, CorruptObject) as exc:
            self.log.warning("checkpoint unusable; starting over", error=str(exc))
            self.resumed_from, self._checkpoint, self.latest = 0, None, 0
            return zeros_for(self.rect)

    async def _read_pointer(self) -> None:
        if self.tile.attempt_count == 0:
            return  # never leased: no checkpoint can exist
        found = await self.ctx.progress.get(self.pointer_key)
        if found is None:
            return
        pointer, self._revision = found
        if pointer.input_hash != self.input_hash or not 0 < pointer.samples_done <= self.job.spp:
            self.log.info(
                "discarding a checkpoint of other inputs or another renderer version",
                samples=pointer.samples_done,
            )
            return
        if self._plan is not None and pointer.samples_done not in self._plan:
            self.log.info("discarding a checkpoint off the pass plan", samples=pointer.samples_done)
            return
        self.resumed_from, self._checkpoint = pointer.samples_done, pointer.checkpoint_key
        self.latest = pointer.samples_done

    async def write(self, acc: Accumulator, samples: int, token: int) -> bool:
        """Object, then pointer, then the fenced row; False if the fence was lost."""
        job, tile, ctx = self.job, self.tile, self.ctx
        key = checkpoint_key(job.job_id, tile.tile_index, self.attempt_id, samples)
        await ctx.store.put(key, to_npy(acc))
        crash.crash_point("worker.before_pointer")
        pointer = ProgressPointer(self.input_hash, samples, key, self.attempt_id)
        try:
            self._revision = await ctx.progress.put(self.pointer_key, pointer, last=self._revision)
        except TerminalError:
            # Someone else wrote the pointer (a stale owner's last checkpoint): it is a valid
            # checkpoint of the same inputs, so write ours on top of what is there now.
            current = await ctx.progress.get(self.pointer_key)
            last = None if current is None else current[1]
            self._revision = await ctx.progress.put(self.pointer_key, pointer, last=last)
        previous, self._checkpoint, self.latest = self._checkpoint, key, samples
        if previous is not None:  # only now that the pointer names the new one
            await ctx.store.delete(previous)
        if not await ctx.db.record_progress(
            job.job_id, tile.tile_index, token=token, samples_done=samples
        ):
            return False
        ctx.metrics.checkpoints.inc()
        self.log.info("checkpoint written", samples=samples, key=key)
        crash.crash_point("worker.after_checkpoint")
        return True

    async def cleanup(self) -> None:
        """Checkpoints of a committed tile are garbage; failing to delete them is harmless."""
        try:
            if self._revision is not None or self._checkpoint is not None:
                await self.ctx.progress.delete(self.pointer_key)
            if self._checkpoint is not None:
                await self.ctx.store.delete(self._checkpoint)
        except RetryableError as exc:
            self.log.warning("checkpoint clean-up failed (tessera gc removes it)", error=str(exc))
