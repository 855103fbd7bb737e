"""The finalizer's read-ahead: used when it is what the tile row names, and only then.

The tiles are rendered and committed by real service processes while no finalizer runs; then a
finalizer runs in this process (on the same NATS, PostgreSQL and object store), so the test can
see and seed what it holds. Three properties:

- the tile-done events reach the read-ahead (its plain subscription in the finalizers' queue
  group) while the tiles render, and finalization then reads nothing from the store;

- a held result that the row does not name (another sha256, another object, the wrong shape)
  is never used: the image is the reference even when those entries hold garbage;
- a held result that the row names is used: the image is the reference even after the result
  objects are deleted from the store behind the finalizer's back.
"""

from __future__ import annotations

import numpy as np

from proto.messages import TileDone
from services.client.api import TesseraClient
from services.finalizer.assemble import Finalizer
from services.finalizer.cache import Images, Result
from shared.core.config import Settings
from shared.core.lifecycle import TileState
from shared.core.tiles import from_npy
from shared.metadata import MetadataStore
from shared.objectstore import DirectoryStore, ObjectStore
from shared.service.runtime import Runtime
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually


def _results(rt: Runtime) -> dict[str, float | None]:
    sample = rt.metrics.registry.get_sample_value
    name = "tessera_finalization_results_total"
    return {s: sample(name, {"source": s}) for s in ("read_ahead", "store", "inline")}


def _held_bytes(rt: Runtime) -> float | None:
    return rt.metrics.registry.get_sample_value("tessera_finalizer_read_ahead_bytes")


async def _committed(
    services: ServiceProcesses, client: TesseraClient, db: MetadataStore, body: dict[str, object]
) -> str:
    services.env["TESSERA_INLINE_RESULT_BYTES"] = "0"  # every result is an object
    for service in ("gateway", "scheduler"):
        services.start(service)
    services.start("worker", name="worker-1")
    job_id: str = (await submit(client, body))["job_id"]

    async def all_done() -> bool:
        tiles = await db.list_tiles(job_id)
        return len(tiles) == 4 and all(t.state is TileState.DONE for t in tiles)

    await eventually(all_done, timeout=60, what="every tile is committed")
    return job_id


async def test_held_results_the_rows_do_not_name_are_not_used(
    services: ServiceProcesses,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    e2e_settings: Settings,
) -> None:
    body = request(width=32, height=32, spp=4, tile_size=16)  # 4 tiles
    job_id = await _committed(services, client, db, body)
    tiles = await db.list_tiles(job_id)
    garbage = np.full((16, 16, 3), 1e9)
    rt = await Runtime.open(e2e_settings, "finalizer")
    try:
        finalizer = Finalizer(rt)
        held = finalizer.read_ahead
        t0, t1, t2 = tiles[0], tiles[1], tiles[2]
        assert t0.result_key and t1.result_key and t2.result_key
        held.put(job_id, 0, Result(t0.result_key, "0" * 64, garbage))  # another sha256
        held.put(job_id, 1, Result(t2.result_key, t2.result_sha256 or "", garbage))  # another key
        wrong_shape = np.zeros((8, 16, 3))
        held.put(job_id, 2, Result(t2.result_key, t2.result_sha256 or "", wrong_shape))
        # the row's result, with images converted for other samples or another renderer: the
        # accumulator is used, converted for this job
        t3 = tiles[3]
        assert t3.result_key
        acc = from_npy(await objects.get(t3.result_key), t3.rect)
        junk = Images(
            5, False, np.full((16, 16, 3), 7, np.float32), np.full((16, 16, 3), 9, np.uint8)
        )
        held.put(job_id, 3, Result(t3.result_key, t3.result_sha256 or "", acc, junk))
        assert await finalizer.finalize(job_id, None)
        assert _results(rt) == {"read_ahead": 1, "store": 3, "inline": 0}
    finally:
        await rt.close()
    status = await client.status(job_id)
    assert await result_bytes(objects, status) == reference_png(body)


async def test_held_results_the_rows_name_are_used(
    services: ServiceProcesses,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    e2e_settings: Settings,
) -> None:
    body = request(width=32, height=32, spp=4, tile_size=16)
    job_id = await _committed(services, client, db, body)
    tiles = await db.list_tiles(job_id)
    rt = await Runtime.open(e2e_settings, "finalizer")
    try:
        finalizer = Finalizer(rt)
        for t in tiles:  # what each tile-done event makes the finalizer read ahead
            assert t.result_key
            done = TileDone(job_id, t.tile_index, "attempt", t.result_key, "input-hash")
            await finalizer.read_ahead_result(done)
            assert finalizer.read_ahead.has(job_id, t.tile_index)
        assert isinstance(objects, DirectoryStore)
        for t in tiles:  # gone from the store: only the held copies can make the image
            assert t.result_key
            objects.path_of(t.result_key).unlink()
        # four float64 16x16 accumulators, their float32 means and 8-bit images
        assert _held_bytes(rt) == 4 * 16 * 16 * 3 * (8 + 4 + 1)
        for t in tiles:
            held = finalizer.read_ahead.get(job_id, t.tile_index)
            images = held.images if held is not None else None
            assert images is not None and (images.samples, images.display_referred) == (4, False)
        assert await finalizer.finalize(job_id, None)
        assert _results(rt) == {"read_ahead": 4, "store": 0, "inline": 0}
        assert _held_bytes(rt) == 0
    finally:
        await rt.close()
    status = await client.status(job_id)
    assert status["state"] == "completed", status
    assert await result_bytes(objects, status) == reference_png(body)
    assert finalizer.read_ahead.bytes == 0, "the job's entries were let go"


async def test_tile_done_events_are_read_ahead_through_the_subscription(
    services: ServiceProcesses,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    e2e_settings: Settings,
) -> None:
    body = request(width=32, height=32, spp=4, tile_size=16)
    rt = await Runtime.open(e2e_settings, "finalizer")
    try:
        finalizer = Finalizer(rt)
        sub = await finalizer.subscribe_read_ahead()
        job_id = await _committed(services, client, db, body)
        await eventually(
            lambda: all(finalizer.read_ahead.has(job_id, i) for i in range(4)),
            timeout=30,
            what="every tile-done event's result read ahead",
        )
        await sub.unsubscribe()
        assert await finalizer.finalize(job_id, None)
        assert _results(rt) == {"read_ahead": 4, "store": 0, "inline": 0}
    finally:
        await rt.close()
    status = await client.status(job_id)
    assert await result_bytes(objects, status) == reference_png(body)
