"""The finalizer's image writes: the PNG and the float image side by side, both ended before
either failure is raised, and a PNG that does not read back intact refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

import kernel.image
from services.finalizer.assemble import Finalizer, ImageCorrupt
from shared.core.errors import StoreUnavailable
from shared.core.lifecycle import JobState, JobTrigger
from shared.metadata import Job
from shared.objectstore import DirectoryStore
from shared.objectstore.base import verify
from shared.service.logs import Log
from tests.doubles.conftest import Meta, meta  # noqa: F401  (fixture: the double, PostgreSQL)
from tests.metadata.conftest import RECTS, make_new_job


class Store(DirectoryStore):
    """A directory store that tells when the PNG was read back, and whose float image write
    fails only after that (``float_fails``)."""

    def __init__(self, root: Path, *, float_fails: bool = False) -> None:
        super().__init__(root)
        self.float_fails = float_fails
        self.png_read_back = asyncio.Event()

    async def put(
        self, key: str, data: bytes, *, durable: bool = True, sha256: str | None = None
    ) -> str:
        if key.endswith(".npy") and self.float_fails:
            # its error must not be raised (the PNG's branch left running) before the PNG
            # has been written and read back
            await asyncio.wait_for(self.png_read_back.wait(), 30)
            raise StoreUnavailable(f"put {key}: disk gone")
        return await super().put(key, data, durable=durable, sha256=sha256)

    async def get(self, key: str, *, sha256: str | None = None) -> bytes:
        try:
            return await super().get(key, sha256=sha256)
        finally:
            if key.endswith(".png"):
                self.png_read_back.set()


class TornStore(Store):
    """... whose PNG reads back with its last bit flipped (checked as ``get`` checks)."""

    async def get(self, key: str, *, sha256: str | None = None) -> bytes:
        if not key.endswith(".png"):
            return await super().get(key, sha256=sha256)
        data = await super().get(key)
        return verify(key, data[:-1] + bytes([data[-1] ^ 1]), sha256)


async def _finalizer(db: Meta, store: DirectoryStore) -> tuple[Finalizer, Job]:
    """A finalizer over ``store`` and ``db`` (the metadata double or PostgreSQL), and a
    running job of ``db`` whose frame is given (every tile done)."""
    job = (await db.submit_job(make_new_job())).job
    await db.plan_tiles(job.job_id, RECTS)
    job = await db.transition_job(job.job_id, JobTrigger.TILES_PLANNED)
    settings = SimpleNamespace(finalizer=SimpleNamespace(read_ahead_bytes=0))
    rt = SimpleNamespace(store=store, db=db, node="f-1", settings=settings, log=Log("test"))
    finalizer = Finalizer(cast(Any, rt))
    mean, image = kernel.image.display_images(np.full((4, 6, 3), 2.0), 4)

    async def assembled(_: Any) -> tuple[np.ndarray, np.ndarray]:
        return mean, image

    finalizer._assemble = assembled  # type: ignore[method-assign,assignment]
    return finalizer, job


async def _objects(store: DirectoryStore, job: Job) -> set[str]:
    return {o.key.rsplit(".", 1)[-1] for o in await store.list(f"renders/{job.job_id}/")}


async def test_a_png_that_does_not_read_back_intact_is_refused_and_the_job_not_completed(
    meta: Meta,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    store = TornStore(tmp_path)
    finalizer, job = await _finalizer(meta, store)
    with pytest.raises(ImageCorrupt, match="did not read back intact"):
        await finalizer._publish(job, "a-1", Log("test"))
    assert (await meta.job_control(job.job_id)).state is JobState.FINALIZING, "not completed"
    assert await _objects(store, job) == {"png", "npy"}, "the float image's write ended too"


async def test_a_failed_float_write_is_raised_once_the_png_is_written_and_read_back(
    meta: Meta,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    store = Store(tmp_path, float_fails=True)
    finalizer, job = await _finalizer(meta, store)
    with pytest.raises(StoreUnavailable, match="disk gone"):
        await finalizer._publish(job, "a-1", Log("test"))
    assert store.png_read_back.is_set()
    assert (await meta.job_control(job.job_id)).state is JobState.FINALIZING, "not completed"
    assert await _objects(store, job) == {"png"}
