"""Prepared scenes, cached per job: built once by the job's renderer, reused by its tiles."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import pathlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from proto import names as n
from shared.core.config import WorkerSettings
from shared.core.errors import RetryableError, TerminalError
from shared.metadata import Job

if TYPE_CHECKING:
    from services.worker.renderers import Renderer

__all__ = ["AssetSource", "KernelFailure", "SceneCache"]


class KernelFailure(TerminalError):
    """The kernel rejected or failed on valid-looking input; it is deterministic, so retrying
    cannot help."""

    code = "kernel_failure"


class AssetSource(Protocol):
    """Where a scene asset's files are on local disk (``services.worker.assets.AssetCache``)."""

    async def materialize(self, manifest_sha256: str) -> pathlib.Path: ...

    def hold(self, manifest_sha256: str) -> contextlib.AbstractAsyncContextManager[pathlib.Path]:
        """The asset's directory, never evicted until the block ends."""
        ...


class SceneCache:
    """A small LRU of prepared scenes keyed by job id, bounded by count and by bytes.

    The newest scene always stays, whatever its size. Tiles of one job that arrive together
    share one preparation instead of each preparing the scene (building the BVH, loading a
    ``.blend``). A job's scene is prepared by its renderer; a scene that is an asset reference
    (every renderer but ``tessera``) is materialised from ``assets`` first, and held while a
    tile renders it (:meth:`use`).
    """

    def __init__(
        self,
        size: int = WorkerSettings.scene_cache,
        max_bytes: int = WorkerSettings.scene_cache_bytes,
        assets: AssetSource | None = None,
    ) -> None:
        self.size, self.max_bytes, self.assets = size, max_bytes, assets
        self._items: OrderedDict[str, tuple[Renderer, Any]] = OrderedDict()
        self._preparing: dict[str, asyncio.Task[Any]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes the cached scenes hold, as their renderers count them."""
        return sum(r.nbytes(p) for r, p in self._items.values())

    @contextlib.asynccontextmanager
    async def use(self, job: Job, renderer: Renderer) -> AsyncIterator[Any]:
        """The prepared scene of ``job`` (:meth:`get`), with its asset held for the block.

        A render reads the asset's files after :meth:`get` returned (a Blender process opens
        the ``.blend`` at its first pass, and again after a restart; POV-Ray reads the scene at
        every tile), so a tile renders inside this block: the asset cache never evicts an asset
        in use, and a hit of an evicted asset downloads it again to the same path before the
        tile starts.
        """
        if renderer.name == n.RENDERER_TESSERA or self.assets is None:
            yield await self.get(job, renderer)
            return
        async with self.assets.hold(str(job.scene["asset"])):
            yield await self.get(job, renderer)

    async def get(self, job: Job, renderer: Renderer) -> Any:
        """The prepared scene of ``job`` by ``renderer``; the renderer's error if it refuses it.

        Preparing runs off the event loop (the renderer's business), so heartbeats of other
        tiles never wait for it. A caller that is cancelled (a hand-back) leaves the
        preparation running for the others, and for the cache.
        """
        hit = self._items.get(job.job_id)
        if hit is not None:
            self._items.move_to_end(job.job_id)
            return hit[1]
        task = self._preparing.get(job.job_id)
        if task is None:
            task = asyncio.create_task(self._prepare(job, renderer))
            self._preparing[job.job_id] = task
            task.add_done_callback(functools.partial(self._prepared, job.job_id, renderer))
        return await asyncio.shield(task)

    async def _prepare(self, job: Job, renderer: Renderer) -> Any:
        asset_dir = None
        if renderer.name != n.RENDERER_TESSERA:  # a reference {"asset", "main", ...}
            if self.assets is None:  # a wiring bug of this worker: leave it to another
                raise RetryableError(f"job {job.job_id}: this worker has no asset cache")
            asset_dir = await self.assets.materialize(str(job.scene["asset"]))
        return await renderer.prepare(job, asset_dir)

    def _prepared(self, job_id: str, renderer: Renderer, task: asyncio.Task[Any]) -> None:
        self._preparing.pop(job_id, None)
        if task.cancelled() or task.exception() is not None:  # (retrieved: no warning)
            return
        self._items[job_id] = (renderer, task.result())
        self._items.move_to_end(job_id)
        while len(self._items) > 1 and (
            len(self._items) > self.size or self.nbytes > self.max_bytes
        ):
            self._items.popitem(last=False)
