"""Deadlines end to end: a job past its deadline ends failed_terminal (deadline_exceeded), and
its in-flight tiles stop within a pass, their attempts saying why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.client.api import TesseraClient
from shared.metadata import MetadataStore
from tests.e2e.flows import request, settle, submit
from tests.e2e.test_pause import rendering
from tests.harness import ServiceProcesses
from tests.helpers import eventually


async def test_a_job_past_its_deadline_fails_and_its_tiles_stop(
    services: ServiceProcesses, client: TesseraClient, db: MetadataStore
) -> None:
    services.start_all(workers=1)
    # the gateway first (the deadline counts from the submit, not from the processes' start)
    await submit(client, request(width=8, height=8, tile_size=8, spp=1, seed=99))
    deadline = datetime.now(UTC) + timedelta(seconds=20)
    # Two 64x64 tiles at the most samples a job may ask: about two minutes of kernel each here
    # (a 16x16 tile at 60000 spp took under 10 s and finished before the deadline), so both are
    # still rendering when the deadline passes.
    body = request(width=128, height=64, tile_size=64, spp=65536, deadline=deadline.isoformat())
    job_id = (await submit(client, body))["job_id"]
    await eventually(lambda: rendering(db, job_id), timeout=60, what="a tile in flight")
    final = await settle(client, job_id, services, timeout=90)
    assert final["state"] == "failed_terminal"
    assert final["last_error_code"] == "deadline_exceeded"

    async def stopped() -> bool:
        attempts = await db.attempts(job_id)
        return bool(attempts) and all(a.ended_at is not None for a in attempts)

    await eventually(stopped, timeout=30, what="every attempt of the failed job ended")
    attempts = await db.attempts(job_id)
    assert {a.error_code for a in attempts} == {"deadline_exceeded"}
    assert {a.outcome for a in attempts} == {"terminal"}
    tiles = await db.list_tiles(job_id)
    assert not [t for t in tiles if t.state.value in ("leased", "progressing", "done")]
    trail = [e for e in await db.job_events(job_id) if e.entity == "job"]
    assert trail[-1].to_state == "failed_terminal" and trail[-1].error_code == "deadline_exceeded"
