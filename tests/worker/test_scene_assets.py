"""A job's scene asset is held while its tiles render: never evicted from under a renderer.

A renderer reads the asset's files during a pass (POV-Ray reads the ``.pov`` and its includes
at every tile; a Blender process opens the ``.blend`` at its first pass and after a restart), so
:meth:`SceneCache.use` holds the asset around a tile's render. Real POV-Ray, a real directory
object store, a real asset cache bounded to one asset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kernel.rect import Rect
from services.worker.assets import AssetCache
from services.worker.renderers.povray import PovrayRenderer
from services.worker.scenes import SceneCache
from shared.core.config import ObjectStoreSettings
from shared.core.lifecycle import JobState
from shared.core.tiles import zeros_for
from shared.metadata import Job
from shared.objectstore import ObjectStore, open_object_store
from tests.renderers.conftest import SCENES, require
from tests.worker.test_asset_cache import put_asset

RECT = Rect(0, 0, 16, 16)


def _job(job_id: str, asset: str) -> Job:
    now = datetime.now(UTC)
    return Job(
        job_id=job_id, idempotency_key=job_id, fingerprint="f", project="p", request={},
        scene={"asset": asset, "main": "scene.pov"}, frame=0, input_hash="h", width=32,
        height=24, spp=1, tile_size=16, tiles_total=4, state=JobState.RUNNING, generation=0,
        cancel_requested=False, result_location=None, result_sha256=None, float_location=None,
        last_error_code=None, last_error=None, created_at=now, updated_at=now, finished_at=None,
        renderer="povray",
    )  # fmt: skip


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    settings = ObjectStoreSettings(kind="file", path=str(tmp_path / "objects"))
    async with await open_object_store(settings) as opened:
        yield opened


@pytest.fixture
async def povray() -> AsyncIterator[PovrayRenderer]:
    require("povray")
    renderer = PovrayRenderer(slots=1, watchdog=60.0)
    yield renderer
    await renderer.close()


async def _assets(store: ObjectStore) -> tuple[list[str], int]:
    files = {p.name: p.read_bytes() for p in sorted(SCENES.iterdir())}
    shas = []
    for letter in b"ABC":  # scenes of the same size: their first comment differs
        text = files["scene.pov"].replace(b"// A", b"// " + bytes([letter]))
        shas.append(await put_asset(store, dict(files, **{"scene.pov": text}), "scene.pov"))
    return shas, sum(len(d) for d in files.values())


async def test_an_asset_in_use_is_not_evicted_and_an_evicted_one_comes_back(
    store: ObjectStore, povray: PovrayRenderer, tmp_path: Path
) -> None:
    (a, b, c), size = await _assets(store)
    cache = AssetCache(store, tmp_path / "cache", max_bytes=size + size // 2)  # room for one
    scenes = SceneCache(assets=cache)
    job = _job("a", a)
    async with scenes.use(job, povray) as prepared:
        await cache.materialize(b)  # another job's asset arrives while a tile of a renders
        assert a in cache.cached(), "the asset of a tile being rendered was evicted"
        acc = zeros_for(RECT)
        await povray.render(prepared, RECT, 0, 1, acc)  # POV-Ray reads the files now
        assert acc.any()
    await cache.materialize(c)  # a is not in use any more: it may go now
    assert a not in cache.cached() and not (tmp_path / "cache" / a).exists()
    async with scenes.use(dataclasses.replace(job), povray) as again:  # a scene-cache hit
        assert again is prepared and a in cache.cached(), "fetched again, same path"
        acc2 = zeros_for(RECT)
        await povray.render(again, RECT, 0, 1, acc2)
    assert (acc2 == acc).all()


async def test_prepared_scenes_of_external_renderers_count_in_the_byte_bound(
    store: ObjectStore, povray: PovrayRenderer, tmp_path: Path
) -> None:
    (a, b, _), _ = await _assets(store)
    scenes = SceneCache(assets=AssetCache(store, tmp_path / "cache", max_bytes=2**30))
    for job in (_job("a", a), _job("b", b)):
        async with scenes.use(job, povray):
            pass
    assert scenes.nbytes == 0  # a second cached scene makes the cache sum its renderers' nbytes
