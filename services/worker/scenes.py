"""Prepared scenes (flattened arrays + BVH + camera), cached per job: built once, reused."""

from __future__ import annotations

from collections import OrderedDict

import kernel
from shared.errors import TerminalError
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
    """A small LRU of prepared scenes keyed by job id (bounded: scenes can be large)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: OrderedDict[str, kernel.Prepared] = OrderedDict()

    def get(self, job: Job) -> kernel.Prepared:
        """The prepared scene of ``job``; :class:`KernelFailure` if the kernel rejects it."""
        hit = self._items.get(job.job_id)
        if hit is not None:
            self._items.move_to_end(job.job_id)
            return hit
        try:
            prepared = kernel.prepare(job.scene, job.frame, settings_of(job))
        except (kernel.SceneError, ValueError, ArithmeticError) as exc:
            raise KernelFailure(f"scene rejected by the kernel: {exc}") from exc
        self._items[job.job_id] = prepared
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return prepared
