"""A worker SIGKILLed after a checkpoint resumes on restart; then gc cleans up, sparing results."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from services.client.api import TesseraClient
from shared.metadata import MetadataStore
from shared.objectstore import DirectoryStore, ObjectStore, checkpoint_key
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually
from tests.ops.conftest import CliRunner, metric, scrape, start_with_port, value, wait_ready

HOUR = 3600.0


async def test_resume_counts_and_gc_spares_published_results(
    services: ServiceProcesses,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    tessera: CliRunner,
) -> None:
    for service in ("gateway", "scheduler"):
        services.start(service)
    _, final_port = start_with_port(services, "finalizer")
    # Tile results as objects (a 16x16 result is small enough to be inline by default): the gc
    # check at the end is that gc never deletes them.
    objects_only = {"TESSERA_INLINE_RESULT_BYTES": "0"}
    worker, port = start_with_port(services, "worker", name="worker-1", **objects_only)
    await wait_ready(port, worker)
    body = request(width=16, height=16, spp=16000, tile_size=16)  # one long tile
    job_id = (await submit(client, body))["job_id"]

    async def checkpointed() -> bool:
        tile = await db.get_tile(job_id, 0)
        return tile is not None and tile.samples_done > 0

    await eventually(checkpointed, timeout=60, what="the tile has a checkpoint")
    assert await metric(port, "tessera_checkpoints_written_total") >= 1
    assert await metric(port, "tessera_tiles_in_flight") == 1
    services.kill("worker-1")
    worker, port = start_with_port(services, "worker", name="worker-1", **objects_only)
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)

    w = await scrape(port)
    assert value(w, "tessera_checkpoint_resumes_total") == 1
    assert value(w, "tessera_lease_takeovers_total") == 1, "the dead worker's row was leased"
    assert value(w, "tessera_tiles_completed_total") == 1
    assert value(w, "tessera_tile_duration_seconds_count") == 1
    assert 0 < value(w, "tessera_kernel_samples_total") < 16 * 16 * 16000, "resumed, not redone"
    assert value(w, "tessera_tiles_in_flight") == 0
    f = await scrape(final_port)
    assert value(f, "tessera_jobs_completed_total") == 1
    assert value(f, "tessera_job_duration_seconds_count") == 1
    assert value(f, "tessera_finalization_duration_seconds_count") == 1
    assert value(f, "tessera_finalization_failures_total", kind="terminal") == 0
    await _gc_spares_results(tessera, objects, job_id, status)


async def _gc_spares_results(
    tessera: CliRunner, objects: ObjectStore, job_id: str, status: dict[str, Any]
) -> None:
    assert isinstance(objects, DirectoryStore)
    stale, fresh = (checkpoint_key(job_id, 0, uuid.uuid4().hex, 8) for _ in range(2))
    for key in (stale, fresh):
        await objects.put(key, b"an orphaned checkpoint")
    temp = objects.root / "tiles" / f".x.npy.{uuid.uuid4().hex}.tmp"
    temp.write_bytes(b"torn")
    alone = objects.root / "checkpoints" / job_id / "7" / f".a-4.npy.{uuid.uuid4().hex}.tmp"
    alone.parent.mkdir(parents=True)
    alone.write_bytes(b"torn, alone in its directory")
    published = [status["result_location"], status["float_location"]]
    published += [o.key for o in await objects.list(f"tiles/{job_id}/")]
    assert len(published) == 3, "the tile result is an object"
    old = time.time() - 2 * HOUR
    for path in [objects.path_of(k) for k in [stale, *published]] + [temp, alone]:
        os.utime(path, (old, old))  # everything but ``fresh`` is past the threshold

    dry = await tessera("gc", "--older-than", "1h", "--dry-run")
    assert dry.status == 0, dry.err
    assert f"would delete {stale}" in dry.out and "its job is completed" in dry.out
    assert "stale temporary file" in dry.out
    assert fresh not in dry.out and not any(k in dry.out for k in published)
    assert await objects.exists(stale) and temp.exists(), "a dry run deletes nothing"

    real = await tessera("gc", "--older-than", "1h")
    assert real.status == 0, real.err
    assert not await objects.exists(stale) and not temp.exists()
    assert not alone.parent.exists(), "the directory it left empty went with it"
    assert await objects.exists(fresh), "younger than the threshold"
    for key in published:
        assert await objects.exists(key), f"gc deleted {key}"
    png = await objects.get(status["result_location"], sha256=status["result_sha256"])
    assert png
