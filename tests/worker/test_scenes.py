"""The worker's prepared-scene cache: shared preparations, bounds by count and by bytes."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

import kernel
from services.worker.renderers.tessera import TesseraKernel
from services.worker.scenes import KernelFailure, SceneCache
from shared.core.lifecycle import JobState
from shared.metadata import Job


def _job(job_id: str, scene: Any = "cornell") -> Job:
    now = datetime.now(UTC)
    doc = kernel.builtin_scene(scene) if isinstance(scene, str) else scene
    return Job(
        job_id=job_id, idempotency_key=job_id, fingerprint="f", project="p", request={},
        scene=doc, frame=0, input_hash="h", width=32, height=24, spp=1, tile_size=16,
        tiles_total=4, state=JobState.RUNNING, generation=0, cancel_requested=False,
        result_location=None, result_sha256=None, float_location=None, last_error_code=None,
        last_error=None, created_at=now, updated_at=now, finished_at=None,
    )  # fmt: skip


@pytest.fixture
async def pool() -> Any:
    renderer = TesseraKernel(2)
    yield renderer
    await renderer.close()


async def test_tiles_arriving_together_share_one_preparation(
    pool: TesseraKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, entered, release = [], threading.Event(), threading.Event()
    real = kernel.prepare

    def slow_prepare(*args: Any) -> kernel.Prepared:
        calls.append(args)
        entered.set()
        assert release.wait(30)
        return real(*args)

    monkeypatch.setattr(kernel, "prepare", slow_prepare)  # the renderer calls kernel.prepare
    cache, job = SceneCache(), _job("a")
    first = asyncio.create_task(cache.get(job, pool))
    assert await asyncio.to_thread(entered.wait, 30), "the preparation started"
    waiters = [first, *(asyncio.create_task(cache.get(job, pool)) for _ in range(4))]
    first.cancel()  # a hand-back: the others (and the cache) still get the scene
    with pytest.raises(asyncio.CancelledError):
        await first
    release.set()
    results = await asyncio.gather(*waiters[1:])
    assert len(calls) == 1 and all(r is results[0] for r in results)
    assert await cache.get(job, pool) is results[0]
    assert len(calls) == 1


async def test_a_rejected_scene_fails_every_waiter_and_is_not_cached(
    pool: TesseraKernel,
) -> None:
    cache, job = SceneCache(), _job("bad", scene={"objects": "not a list"})
    outcomes = await asyncio.gather(
        *(cache.get(job, pool) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, KernelFailure) for o in outcomes), outcomes
    assert cache.nbytes == 0
    with pytest.raises(KernelFailure):
        await cache.get(job, pool)  # tried again, not a cached failure


async def test_bounded_by_count_and_by_bytes_newest_always_kept(pool: TesseraKernel) -> None:
    by_count = SceneCache(size=2)
    for name in "abc":
        await by_count.get(_job(name), pool)
    assert list(by_count._items) == ["b", "c"]
    one = pool.nbytes(await SceneCache().get(_job("x"), pool))
    by_bytes = SceneCache(size=8, max_bytes=2 * one)
    for name in "abcd":
        await by_bytes.get(_job(name), pool)
    assert list(by_bytes._items) == ["c", "d"] and by_bytes.nbytes <= 2 * one
    tiny = SceneCache(max_bytes=1)
    await tiny.get(_job("big"), pool)
    assert list(tiny._items) == ["big"], "the scene in use stays even over the bound"


async def test_a_mesh_scene_counts_its_source_arrays(pool: TesseraKernel) -> None:
    prepared = await SceneCache().get(_job("m", scene="mesh"), pool)
    mesh = sum(m.vertices.nbytes + m.indices.nbytes for m in prepared.scene.meshes)
    flat = sum(a.nbytes for a in (*prepared.geometry(), prepared.camera, prepared.params))
    assert mesh > 0 and pool.nbytes(prepared) == mesh + flat
