"""Worker life cycle: SIGTERM hands tiles back with a checkpoint; the watchdog aborts stalls."""

from __future__ import annotations

import signal

from services.client.api import TesseraClient
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually


async def test_sigterm_hands_the_tile_back_and_another_worker_resumes_it(
    services: ServiceProcesses, client: TesseraClient, objects: ObjectStore, db: MetadataStore
) -> None:
    for service in ("gateway", "scheduler", "finalizer"):
        services.start(service)
    first = services.start("worker", name="worker-1")
    body = request(width=16, height=16, spp=40000, tile_size=16)  # seconds, even split in two
    job_id = (await submit(client, body))["job_id"]

    async def checkpointed() -> bool:
        tile = await db.get_tile(job_id, 0)
        return tile is not None and tile.samples_done > 0

    await eventually(checkpointed, timeout=60, what="worker-1 checkpoints the tile")
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0, "the worker drains and exits cleanly within the grace"
    attempts = await db.attempts(job_id)
    assert [a.outcome for a in attempts] == ["handed_back"]
    services.start("worker", name="worker-2")
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)
    resumed = [a for a in await db.attempts(job_id) if a.node == "worker-2"]
    assert len(resumed) == 1 and resumed[0].resumed_from > 0, resumed


async def test_the_watchdog_aborts_a_pass_that_stops_advancing(
    services: ServiceProcesses, client: TesseraClient, db: MetadataStore
) -> None:
    slow_passes = {
        "TESSERA_PROGRESS_TIMEOUT": "1",  # seconds a pass may take
        "TESSERA_SAMPLES_PER_PASS": "60000",  # one pass of a 16x16 tile: several seconds
        "TESSERA_MAX_DELIVER": "2",
    }
    for service in ("gateway", "scheduler", "finalizer"):
        services.start(service, env=slow_passes)
    services.start("worker", name="worker-1", env=slow_passes)
    body = request(width=16, height=16, spp=60000, tile_size=16)
    job_id = (await submit(client, body))["job_id"]

    async def stalled() -> list[str]:
        return [a.error_code or "" for a in await db.attempts(job_id) if a.outcome]

    codes = await eventually(stalled, timeout=60, what="an attempt is aborted")
    assert codes[0] == "stalled", codes
    tile = await db.get_tile(job_id, 0)
    assert tile is not None
    # With MAX_DELIVER 2 the scheduler may already have dead-lettered the tile (its second
    # delivery stalls too); its error then names the stall as the last error.
    assert tile.last_error_code == "stalled" or (
        tile.last_error_code == "max_deliveries" and "[stalled]" in (tile.last_error or "")
    ), (tile.last_error_code, tile.last_error)
    failures = [e for e in await db.job_events(job_id) if e.trigger == "retryable_failure"]
    assert failures and failures[0].tile_index == 0 and failures[0].error_code == "stalled"
