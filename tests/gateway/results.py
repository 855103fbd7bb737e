"""Helpers of the result tests: a job made completed with chosen image bytes."""

from __future__ import annotations

from proto.api import SubmitRequest
from services.client.api import TesseraClient
from shared.core.lifecycle import JobTrigger
from shared.objectstore import render_key, sha256_hex
from shared.service.runtime import Runtime
from tests.gateway.conftest import body


async def completed_job(
    rt: Runtime, client: TesseraClient, png: bytes, floats: bytes, **overrides: object
) -> str:
    """A submitted job, completed by hand with ``png`` and ``floats`` at their render keys."""
    job_id: str = (await client.submit(SubmitRequest(**body(**overrides))))["job_id"]
    png_key = render_key(job_id, sha256_hex(png), "png")
    float_key = render_key(job_id, sha256_hex(floats), "npy")
    sha = await rt.store.put(png_key, png)
    await rt.store.put(float_key, floats)
    for trigger in (JobTrigger.TILES_PLANNED, JobTrigger.ALL_TILES_DONE):
        await rt.db.transition_job(job_id, trigger)
    await rt.db.complete_job(
        job_id, result_location=png_key, result_sha256=sha, float_location=float_key
    )
    return job_id
