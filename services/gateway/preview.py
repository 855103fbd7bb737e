"""``job.preview``: the image so far, painted tile by tile into a cached, downscaled canvas.

A canvas per ``(job, max_edge)`` holds the preview's pixels (8-bit, at most 2048 on its longer
side) and which source each tile was painted from: a done tile's result (by sha256; it never
changes) or an unfinished tile's checkpoint (by the samples its row records). A request paints
only the tiles whose source changed, each tone-mapped on its own (the mean of its own samples,
:func:`kernel.image.display8`, the finalizer's curve) and downscaled into its place; a tile
with nothing yet stays dark grey. Done tiles are read through
:func:`shared.service.tileresults.committed_result` (the finalizer's checked read), unfinished
ones through their progress pointer.

Bounded: the PNG is encoded again at most once per :data:`MIN_INTERVAL` per job, and only when
the ``version`` (a digest of every tile's state, samples and result) changed; the cache holds at
most :data:`CACHE_ENTRIES` canvases and :data:`CACHE_BYTES` of pixels (least recently used out);
tile bytes are read in batches of at most :data:`BATCH_BYTES`. A PNG that would not fit in one
reply is encoded smaller until it does.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
from PIL import Image

import kernel.image
from proto import names as n
from proto.api_replies import JobPreviewReply
from shared.core.errors import DecodeError, NotFoundError
from shared.core.lifecycle import TileState
from shared.core.tiles import from_npy
from shared.metadata import Job, MetadataStore, Tile
from shared.nats.leases import ProgressPointers
from shared.objectstore import CorruptObject, ObjectStore
from shared.service.tileresults import ResultMissing, committed_result

__all__ = ["MIN_INTERVAL", "MISSING_GREY", "Previews"]

MIN_INTERVAL = 1.0
"""Seconds between two encodes of one job's preview."""
CACHE_ENTRIES = 32
CACHE_BYTES = 96 * 2**20
BATCH_BYTES = 64 * 2**20
MISSING_GREY = 48
"""The value (R = G = B) of a pixel no tile has rendered yet."""
_READS = 16
_ENVELOPE = 2048  # the reply's other fields, with room to spare

Source = tuple[str, str | int]


@dataclass
class _Canvas:
    """One cached preview: its pixels, what each tile was painted from, the last encode."""

    pixels: np.ndarray
    scale: float
    painted: dict[int, Source] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reply: JobPreviewReply | None = None

    @property
    def nbytes(self) -> int:
        return int(self.pixels.nbytes)


def geometry(width: int, height: int, max_edge: int) -> tuple[int, int, float]:
    """The preview's size for a ``width`` x ``height`` job and its scale (at most 1)."""
    scale = min(1.0, max_edge / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale)), scale


def version_of(job: Job, tiles: list[Tile]) -> str:
    """A digest of what the preview is made of: changes when any tile's state, samples or
    result changes (or the job's generation)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{job.generation}".encode())
    for t in tiles:
        h.update(f"|{t.tile_index}:{t.state.value}:{t.samples_done}:{t.result_sha256}".encode())
    return h.hexdigest()


def _source(t: Tile) -> Source | None:
    if t.state is TileState.DONE and t.result_sha256:
        return ("done", t.result_sha256)
    if t.samples_done > 0:
        return ("partial", t.samples_done)
    return None


class Previews:
    """The preview canvases of one gateway."""

    def __init__(
        self,
        db: MetadataStore,
        store: ObjectStore,
        progress: ProgressPointers,
        *,
        reply_budget: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.store, self.progress = db, store, progress
        self.budget = max(1024, reply_budget - _ENVELOPE)
        self.clock = clock
        self._cache: OrderedDict[tuple[str, int], _Canvas] = OrderedDict()
        self._encoded_at: dict[str, float] = {}
        #: PNG encodes done (each reply from the cache is not one)
        self.encodes = 0

    async def preview(self, job: Job, max_edge: int) -> JobPreviewReply:
        """The job's preview fitting ``max_edge``: from the cache when nothing changed or it
        was encoded less than :data:`MIN_INTERVAL` ago."""
        canvas = self._canvas(job, max_edge)
        async with canvas.lock:
            last = self._encoded_at.get(job.job_id, -float("inf"))
            if canvas.reply is not None and self.clock() - last < MIN_INTERVAL:
                return canvas.reply
            tiles = await self.db.list_tiles(job.job_id)
            version = version_of(job, tiles)
            if canvas.reply is not None and canvas.reply.version == version:
                return canvas.reply
            await self._paint(canvas, job, tiles)
            png, width, height = await asyncio.to_thread(self._encode, canvas.pixels)
            self.encodes += 1
            self._encoded_at[job.job_id] = self.clock()
            canvas.reply = JobPreviewReply(
                job_id=job.job_id,
                width=width,
                height=height,
                tiles_done=sum(1 for t in tiles if t.state is TileState.DONE),
                tiles_total=len(tiles),
                samples_done=sum(t.samples_done for t in tiles),
                samples_total=job.spp * len(tiles),
                content_type="image/png",
                data_b64=base64.b64encode(png).decode(),
                version=version,
                max_edge=max_edge,
                encoded_at=datetime.now(UTC).isoformat(),
            )
            return canvas.reply

    def _canvas(self, job: Job, max_edge: int) -> _Canvas:
        key = (job.job_id, max_edge)
        canvas = self._cache.get(key)
        if canvas is not None:
            self._cache.move_to_end(key)
            return canvas
        w, h, scale = geometry(job.width, job.height, max_edge)
        canvas = _Canvas(np.full((h, w, 3), MISSING_GREY, dtype=np.uint8), scale)
        self._cache[key] = canvas
        while len(self._cache) > 1 and (
            len(self._cache) > CACHE_ENTRIES
            or sum(c.nbytes for c in self._cache.values()) > CACHE_BYTES
        ):
            (old_job, _), _ = self._cache.popitem(last=False)
            if not any(j == old_job for j, _ in self._cache):
                self._encoded_at.pop(old_job, None)
        return canvas

    async def _paint(self, canvas: _Canvas, job: Job, tiles: list[Tile]) -> None:
        """Paint every tile whose source changed since the canvas last showed it."""
        todo: list[tuple[Tile, Source]] = []
        for t in tiles:
            source = _source(t)
            if source is None:
                if canvas.painted.pop(t.tile_index, None) is not None:
                    self._fill(canvas, t, None)  # rendered again from zero: grey once more
            elif canvas.painted.get(t.tile_index) != source:
                todo.append((t, source))
        batch: list[tuple[Tile, Source]] = []
        size = 0
        for item in todo:
            batch.append(item)
            size += (item[0].x1 - item[0].x0) * (item[0].y1 - item[0].y0) * 24
            if size >= BATCH_BYTES:
                await self._paint_batch(canvas, job, batch)
                batch, size = [], 0
        if batch:
            await self._paint_batch(canvas, job, batch)

    async def _paint_batch(
        self, canvas: _Canvas, job: Job, batch: list[tuple[Tile, Source]]
    ) -> None:
        inline_wanted = [t.tile_index for t, s in batch if s[0] == "done" and not t.result_key]
        inline = await self.db.console.inline_results(job.job_id, inline_wanted)
        gate = asyncio.Semaphore(_READS)
        loaded = await asyncio.gather(*(self._read(job, t, s, inline, gate) for t, s in batch))
        parts = [(t, s, got) for (t, s), got in zip(batch, loaded, strict=True) if got is not None]
        referred = job.renderer in n.DISPLAY_REFERRED_RENDERERS
        await asyncio.to_thread(self._paste, canvas, parts, referred)

    async def _read(
        self,
        job: Job,
        t: Tile,
        source: Source,
        inline: dict[int, tuple[str, bytes]],
        gate: asyncio.Semaphore,
    ) -> tuple[bytes, int] | None:
        """The tile's bytes and their samples per pixel; None if they cannot be read now (the
        tile keeps what it shows, and is tried again at the next encode)."""
        try:
            if source[0] == "done":
                return await committed_result(self.store, t, inline, gate), job.spp
            found = await self.progress.get(n.progress_key(job.job_id, t.tile_index))
            if found is None or not 0 < found[0].samples_done <= job.spp:
                return None
            async with gate:
                return await self.store.get(found[0].checkpoint_key), found[0].samples_done
        except (ResultMissing, NotFoundError, CorruptObject, DecodeError):
            # a checkpoint replaced meanwhile, a result being rendered again; a store that is
            # down is not this: StoreUnavailable makes the reply ``unavailable``
            return None

    def _paste(
        self,
        canvas: _Canvas,
        parts: list[tuple[Tile, Source, tuple[bytes, int]]],
        display_referred: bool,
    ) -> None:
        for t, source, (data, samples) in parts:
            try:
                acc = from_npy(data, t.rect)
            except DecodeError:
                continue
            image = kernel.image.display8(acc, samples, display_referred=display_referred)
            self._fill(canvas, t, image)
            canvas.painted[t.tile_index] = source

    @staticmethod
    def _fill(canvas: _Canvas, t: Tile, image: np.ndarray | None) -> None:
        """Put ``image`` (the tile at full size; None: grey) into the tile's preview cells."""
        s = canvas.scale
        h, w = canvas.pixels.shape[:2]
        x0, x1 = min(w, round(t.x0 * s)), min(w, round(t.x1 * s))
        y0, y1 = min(h, round(t.y0 * s)), min(h, round(t.y1 * s))
        if x1 <= x0 or y1 <= y0:
            return  # smaller than a preview pixel: its neighbours cover the spot
        cells = canvas.pixels[y0:y1, x0:x1]
        if image is None:
            cells[...] = MISSING_GREY
        elif image.shape[:2] == cells.shape[:2]:
            cells[...] = image
        else:
            small = Image.fromarray(image).resize((x1 - x0, y1 - y0), Image.Resampling.BOX)
            cells[...] = np.asarray(small)

    def _encode(self, pixels: np.ndarray) -> tuple[bytes, int, int]:
        """PNG bytes of ``pixels`` (the finalizer's encoder), smaller until their base64 fits
        in the reply; the PNG's width and height."""
        image = pixels
        while True:
            png = kernel.image.png_of(image)
            h, w = image.shape[:2]
            if -(-len(png) // 3) * 4 <= self.budget or max(w, h) <= 16:
                return png, w, h
            shrink = max(0.5, min(0.9, (self.budget / (len(png) * 4 / 3)) ** 0.5))
            size = (max(1, int(w * shrink)), max(1, int(h * shrink)))
            image = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BOX))
