"""A committed tile result found missing or corrupt at finalization is rendered again.

The tiles are committed while no finalizer runs; then one tile's result is damaged (the object
overwritten, or the inline bytes changed in the database) and the finalizer starts. It must not
publish a wrong image nor give the job up: the damaged tile goes back to ``queued``, the sweeper
re-publishes it, a worker renders it again (the kernel is deterministic) and the job completes
with the reference image.
"""

from __future__ import annotations

import asyncpg
import pytest

from services.client.api import TesseraClient
from shared.core.lifecycle import TileState
from shared.metadata import AttemptOutcome, MetadataStore
from shared.objectstore import DirectoryStore, ObjectStore
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually


@pytest.mark.parametrize("results", ["objects", "inline"])
async def test_a_damaged_tile_result_is_rendered_again(
    services: ServiceProcesses,
    client: TesseraClient,
    objects: ObjectStore,
    db: MetadataStore,
    database_url: str,
    results: str,
) -> None:
    if results == "objects":
        services.env["TESSERA_INLINE_RESULT_BYTES"] = "0"
    for service in ("gateway", "scheduler"):
        services.start(service)
    services.start("worker", name="worker-1")
    body = request(width=32, height=32, spp=8, tile_size=16)  # 4 tiles
    job_id = (await submit(client, body))["job_id"]

    async def all_done() -> bool:
        tiles = await db.list_tiles(job_id)
        return len(tiles) == 4 and all(t.state is TileState.DONE for t in tiles)

    await eventually(all_done, timeout=60, what="every tile is committed")
    damaged = await db.get_tile(job_id, 1)
    assert damaged is not None
    if results == "objects":
        assert isinstance(objects, DirectoryStore) and damaged.result_key
        objects.path_of(damaged.result_key).write_bytes(b"torn by a disk")
    else:
        conn = await asyncpg.connect(database_url)
        try:
            changed = await conn.execute(
                "UPDATE tile_results SET data = $3 WHERE job_id = $1 AND tile_index = $2",
                job_id,
                1,
                b"flipped bits",
            )
        finally:
            await conn.close()
        assert changed == "UPDATE 1"

    services.start("finalizer")
    status = await settle(client, job_id, services)
    assert status["state"] == "completed", status
    assert await result_bytes(objects, status) == reference_png(body)

    renders = [
        a
        for a in await db.attempts(job_id)
        if a.tile_index == 1 and a.outcome is AttemptOutcome.DONE
    ]
    assert len(renders) == 2, "tile 1 was rendered twice"
    others = [a for a in await db.attempts(job_id) if a.tile_index in (0, 2, 3)]
    assert len(others) == 3, "only the damaged tile was rendered again"
    finals = [a for a in await db.attempts(job_id) if a.kind == "final"]
    assert [(a.outcome, a.error_code) for a in finals] == [
        (AttemptOutcome.RETRYABLE, "result_lost"),
        (AttemptOutcome.DONE, None),
    ]
    lost = [e for e in await db.job_events(job_id) if e.trigger == "result_lost"]
    assert {(e.entity, e.tile_index, e.from_state, e.to_state) for e in lost} == {
        ("job", None, "finalizing", "progressing"),
        ("tile", 1, "done", "queued"),
    }
