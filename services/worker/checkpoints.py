"""One tile's checkpoints: where to resume, loading, writing, clean-up.

A checkpoint is the tile's float64 accumulator after ``samples`` per pixel, written under a key
of its own (``checkpoints/<job>/<tile>/<attempt>-<samples>.npy``, never overwritten), then
named by the tile's progress pointer (KV, compare-and-set, carrying ``input_hash``), then
recorded in the tile row under the owner's fence. A resume trusts the pointer only if its
``input_hash`` is the job's and the object it names loads with the tile's shape; anything else
starts from zero. Because every key is written once, a crash between the object and the pointer
leaves the pointer naming exactly the bytes of the samples it records.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.rect import Rect
from proto import names as n
from shared import crash
from shared.errors import DecodeError, NotFoundError, RetryableError, TerminalError
from shared.leases import ProgressPointer
from shared.logs import Log
from shared.metadata import Job, Tile
from shared.objectstore import CorruptObject, checkpoint_key
from shared.runtime import Runtime
from shared.tiles import Accumulator, from_npy, to_npy, zeros_for

__all__ = ["Checkpoints", "Progress"]


@dataclass
class Progress:
    """How far one attempt has got, and what its latest checkpoint is."""

    samples: int = 0
    pointer_revision: int | None = None
    checkpoint: str | None = None
    resumed_from: int = 0


class Checkpoints:
    """Checkpoints of one tile by one attempt."""

    def __init__(self, rt: Runtime, job: Job, tile: Tile, attempt_id: str, log: Log) -> None:
        self.rt, self.job, self.tile, self.attempt_id, self.log = rt, job, tile, attempt_id, log
        self.rect: Rect = tile.rect
        self.pointer_key = n.progress_key(job.job_id, tile.tile_index)

    async def resume_point(self) -> Progress:
        """What the progress pointer offers (nothing for a tile never leased before)."""
        if self.tile.attempt_count == 0:
            return Progress()  # never leased: no checkpoint can exist
        found = await self.rt.progress.get(self.pointer_key)
        if found is None:
            return Progress()
        pointer, rev = found
        if (
            pointer.input_hash != self.job.input_hash
            or not 0 < pointer.samples_done <= self.job.spp
        ):
            self.log.info("discarding a checkpoint of other inputs", samples=pointer.samples_done)
            return Progress(pointer_revision=rev)
        return Progress(pointer.samples_done, rev, pointer.checkpoint_key, pointer.samples_done)

    async def load(self, progress: Progress) -> Accumulator:
        """The accumulator to continue from: the checkpoint's, or zeros if it is unusable."""
        if progress.checkpoint is None:
            return zeros_for(self.rect)
        try:
            acc = from_npy(await self.rt.store.get(progress.checkpoint), self.rect)
        except (NotFoundError, DecodeError, CorruptObject) as exc:
            self.log.warning("checkpoint unusable; starting over", error=str(exc))
            progress.samples = progress.resumed_from = 0
            progress.checkpoint = None
            return zeros_for(self.rect)
        return acc

    async def write(self, acc: Accumulator, progress: Progress, token: int) -> bool:
        """Object, then pointer, then the fenced row; False if the fence was lost."""
        job, tile = self.job, self.tile
        key = checkpoint_key(job.job_id, tile.tile_index, self.attempt_id, progress.samples)
        await self.rt.store.put(key, to_npy(acc))
        crash.crash_point("worker.before_pointer")
        pointer = ProgressPointer(job.input_hash, progress.samples, key, self.attempt_id)
        try:
            progress.pointer_revision = await self.rt.progress.put(
                self.pointer_key, pointer, last=progress.pointer_revision
            )
        except TerminalError:
            # Someone else wrote the pointer (a stale owner's last checkpoint): it is a valid
            # checkpoint of the same inputs, so write ours on top of what is there now.
            current = await self.rt.progress.get(self.pointer_key)
            last = None if current is None else current[1]
            progress.pointer_revision = await self.rt.progress.put(
                self.pointer_key, pointer, last=last
            )
        previous, progress.checkpoint = progress.checkpoint, key
        if previous is not None:  # only now that the pointer names the new one
            await self.rt.store.delete(previous)
        if not await self.rt.db.record_progress(
            job.job_id, tile.tile_index, token=token, samples_done=progress.samples
        ):
            return False
        self.rt.metrics.checkpoints.inc()
        self.log.info("checkpoint written", samples=progress.samples, key=key)
        crash.crash_point("worker.after_checkpoint")
        return True

    async def cleanup(self, progress: Progress) -> None:
        """Checkpoints of a committed tile are garbage; failing to delete them is harmless."""
        try:
            if progress.pointer_revision is not None or progress.checkpoint is not None:
                await self.rt.progress.delete(self.pointer_key)
            if progress.checkpoint is not None:
                await self.rt.store.delete(progress.checkpoint)
        except RetryableError as exc:
            self.log.warning("checkpoint clean-up failed (tessera gc removes it)", error=str(exc))
