"""``tessera``: the numba path tracer (:mod:`kernel`) as a renderer.

:class:`TesseraKernel` is a :class:`~services.worker.renderers.Renderer`.

The scene is the job's inline document; preparing flattens it and builds the BVH on the kernel
threads, and a pass runs on them too (:class:`~services.worker.kernels.KernelThreads`, which
numba lets run without the GIL). Passes are sized adaptively by the render loop: the kernel adds
samples pixel by pixel in order, so any split of ``[0, spp)`` gives the same bits.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib

import numpy as np

import kernel
import kernel.flatten  # numba loads when the worker starts, not on its first scene
from kernel.hashing import KERNEL_VERSION
from kernel.rect import Rect
from services.worker.kernels import KernelThreads
from services.worker.renderers import TESSERA, Found, PassPlan
from services.worker.scenes import KernelFailure
from shared.core.tiles import Accumulator
from shared.metadata import Job

__all__ = ["TesseraKernel", "create", "settings_of"]


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


class TesseraKernel:
    """The numba kernel on ``slots`` threads."""

    name = TESSERA
    version = KERNEL_VERSION
    interruptible = False  # numba threads cannot be stopped mid-pass

    def __init__(self, slots: int) -> None:
        self.threads = KernelThreads(slots)

    async def prepare(self, job: Job, asset_dir: pathlib.Path | None) -> kernel.Prepared:
        """Flatten the job's scene and build its BVH on a kernel thread.

        :class:`KernelFailure` if the kernel rejects the scene or it degenerates to
        non-finite arrays (the same document fails the same way everywhere: terminal).
        """
        loop = asyncio.get_running_loop()
        work = functools.partial(kernel.prepare, job.scene, job.frame, settings_of(job))
        try:
            prepared = await loop.run_in_executor(self.threads.executor, work)
        except (kernel.SceneError, ValueError, ArithmeticError) as exc:
            raise KernelFailure(f"scene rejected by the kernel: {exc}") from exc
        _check_finite(prepared)
        return prepared

    async def render(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        """Samples ``[start, end)`` of ``rect`` into ``acc`` on the kernel threads; the seconds
        the kernel calls took on them."""
        try:
            return await self.threads.render(prepared, rect, start, end, acc)
        except (ValueError, ArithmeticError, kernel.SceneError) as exc:
            raise KernelFailure(f"kernel failed on samples {start}..{end}: {exc}") from exc

    def passes(self, job: Job) -> PassPlan | None:
        """None: any split gives the same bits, so the render loop sizes passes by rate."""
        return None

    def nbytes(self, prepared: kernel.Prepared) -> int:
        """The arrays a prepared scene keeps: the flattened geometry and its meshes' sources."""
        meshes = [a for m in prepared.scene.meshes for a in (m.vertices, m.indices)]
        arrays = (*prepared.geometry(), prepared.camera, prepared.params, *meshes)
        return sum(int(a.nbytes) for a in arrays)

    async def close(self) -> None:
        """Stop taking passes; a pass still running ends on its own (threads are not killed)."""
        self.threads.executor.shutdown(wait=False, cancel_futures=True)


def create(found: Found, slots: int) -> TesseraKernel:
    """The registry's constructor (``found`` says nothing the kernel needs)."""
    return TesseraKernel(slots)


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
