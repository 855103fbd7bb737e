"""Prepared scenes (flattened arrays + BVH + camera), cached per job: built once, reused."""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from concurrent.futures import Executor

import numpy as np

import kernel.flatten  # numba loads when the worker starts, not on its first scene
from shared.core.config import WorkerSettings
from shared.core.errors import TerminalError
from shared.metadata import Job

__all__ = ["KernelFailure", "SceneCache", "settings_of"]


class KernelFailure(TerminalError):
    """The kernel rejected or failed on valid-looking input; it is deterministic, so retrying
    cannot help."""

    code = "kernel_failure"


def settings_of(job: Job) -> kernel.RenderSettings:
    """The kernel's render settings of a job."""
    request = job.request
    return kernel.RenderSettings(
        width=job.width,
        height=job.height,
        spp=job.spp,
        max_depth=int(request.get("max_depth", kernel.RenderSettings.max_depth)),
        seed=int(request.get("seed", 0)),
    )


class SceneCache:
    """A small LRU of prepared scenes keyed by job id, bounded by count and by bytes.

    The newest scene always stays, whatever its size. Tiles of one job that arrive together
    share one preparation instead of each building the BVH.
    """

    def __init__(
        self,
        size: int = WorkerSettings.scene_cache,
        max_bytes: int = WorkerSettings.scene_cache_bytes,
    ) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._items: OrderedDict[str, kernel.Prepared] = OrderedDict()
        self._preparing: dict[str, asyncio.Task[kernel.Prepared]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays the cached scenes hold."""
        return sum(_nbytes(p) for p in self._items.values())

    async def get(self, job: Job, executor: Executor) -> kernel.Prepared:
        """The prepared scene of ``job``; :class:`KernelFailure` if the kernel rejects it.

        Preparing (flattening, building the BVH of a large mesh) runs on ``executor``, off the
        event loop, so heartbeats of other tiles never wait for it. A caller that is cancelled
        (a hand-back) leaves the preparation running for the others, and for the cache.
        """
        hit = self._items.get(job.job_id)
        if hit is not None:
            self._items.move_to_end(job.job_id)
            return hit
        task = self._preparing.get(job.job_id)
        if task is None:
            task = asyncio.create_task(self._prepare(job, executor))
            self._preparing[job.job_id] = task
            task.add_done_callback(functools.partial(self._prepared, job.job_id))
        return await asyncio.shield(task)

    async def _prepare(self, job: Job, executor: Executor) -> kernel.Prepared:
        loop = asyncio.get_running_loop()
        work = functools.partial(kernel.prepare, job.scene, job.frame, settings_of(job))
        try:
            prepared = await loop.run_in_executor(executor, work)
        except (kernel.SceneError, ValueError, ArithmeticError) as exc:
            raise KernelFailure(f"scene rejected by the kernel: {exc}") from exc
        _check_finite(prepared)
        return prepared

    def _prepared(self, job_id: str, task: asyncio.Task[kernel.Prepared]) -> None:
        self._preparing.pop(job_id, None)
        if task.cancelled() or task.exception() is not None:  # (retrieved: no warning)
            return
        self._items[job_id] = task.result()
        self._items.move_to_end(job_id)
        while len(self._items) > 1 and (
            len(self._items) > self.size or self.nbytes > self.max_bytes
        ):
            self._items.popitem(last=False)


def _nbytes(prepared: kernel.Prepared) -> int:
    """The arrays a prepared scene keeps: the flattened geometry and its meshes' sources."""
    meshes = [a for m in prepared.scene.meshes for a in (m.vertices, m.indices)]
    arrays = (*prepared.geometry(), prepared.camera, prepared.params, *meshes)
    return sum(int(a.nbytes) for a in arrays)


def _check_finite(prepared: kernel.Prepared) -> None:
    """:class:`KernelFailure` unless every array the tracer reads is finite.

    Validation checks the document, not the arithmetic on it: a vector that validates but
    underflows when normalised (``camera.up = [1e-200, 0, 0]``: its norm is 0) gives a NaN
    camera, and the tracer would publish an image of NaN rays as if it were a render. The same
    document fails the same way on every worker, so this is terminal, never retried.
    """
    for name in ("spheres", "triangles", "normals", "boxes", "materials", "camera"):
        values = getattr(prepared, name)
        if values.size and not np.isfinite(values).all():
            raise KernelFailure(f"scene degenerates in the kernel: non-finite {name} array")
