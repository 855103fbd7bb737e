"""Sweeper benchmark (not a test): the cost of one sweep pass over 1,000 stale tiles.

Run: ``python -m bench.sweeper``. On the embedded stack (NATS, PostgreSQL), one job of 1,000
tiles is planned and published by the real planner, its publish times moved past
``TESSERA_SWEEP_AGE``, and one :meth:`Sweeper.sweep_once` is timed in two cases:

(a) backlog: every tile still has its message in ``TILES`` (waiting for a worker), so nothing is
    lost and nothing may be re-published;
(b) lost: the ``TILES`` stream purged, no leases, so all 1,000 tiles are re-published.

Printed per case: wall time of the pass, NATS messages the scheduler's connection sent (requests
and publishes), and tiles re-published. The pass before issue 14 asked for the lease and the
stream message of each tile one after the other (2,000 sequential requests for (a)).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from proto.messages import JobMessage
from proto.names import STREAM_TILES, new_job_id
from services.scheduler.planner import Planner
from services.scheduler.sweeper import Sweeper
from shared.core.config import Settings
from shared.devstack.stack import Stack
from shared.metadata import NewJob
from shared.service.runtime import Runtime

WIDTH, HEIGHT, TILE = 320, 200, 8
"""1,000 tiles: the sweeper's snapshot limit."""


async def _job(rt: Runtime) -> str:
    request = {"spp": 1, "width": WIDTH, "height": HEIGHT, "tile": TILE, "n": uuid.uuid4().hex}
    fingerprint = hashlib.sha256(repr(sorted(request.items())).encode()).hexdigest()
    new = NewJob(
        job_id=new_job_id(),
        idempotency_key=uuid.uuid4().hex,
        fingerprint=fingerprint,
        project="bench",
        request=request,
        scene={"spheres": [{"c": [0, 0, -1], "r": 0.5}], "camera": {"fov": 40}},
        frame=0,
        input_hash="in-" + fingerprint[:16],
        width=WIDTH,
        height=HEIGHT,
        spp=1,
        tile_size=TILE,
    )
    job_id = (await rt.db.submit_job(new)).job.job_id
    await Planner(rt).plan(JobMessage(job_id, 0))
    conn = await asyncpg.connect(rt.settings.database_url)
    try:  # published two minutes ago: stale for the default 60 s sweep age
        await conn.execute(
            "UPDATE tiles SET published_at = now() - interval '2 minutes' WHERE job_id = $1",
            job_id,
        )
    finally:
        await conn.close()
    return job_id


async def _pass(rt: Runtime, sweeper: Sweeper) -> tuple[float, int, int]:
    sent = rt.nc.stats["out_msgs"]
    started = time.perf_counter()
    swept = await sweeper.sweep_once()
    seconds = time.perf_counter() - started
    return seconds, int(rt.nc.stats["out_msgs"] - sent), len(swept)


async def run(stack: Stack, rounds: int) -> None:
    env = stack.env() | {"TESSERA_NAMESPACE": f"b{uuid.uuid4().hex[:8]}", "TESSERA_NODE": "bench"}
    rt = await Runtime.open(Settings.from_env(env), "scheduler")
    try:
        sweeper = Sweeper(rt)
        for r in range(rounds):
            job_id = await _job(rt)
            secs, msgs, swept = await _pass(rt, sweeper)
            print(f"(a) round {r + 1}: 1000 stale tiles, all with a message: {secs * 1000:.0f} ms, "
                  f"{msgs} NATS messages sent, {swept} re-published")  # fmt: skip
            await rt.js.purge_stream(rt.names.stream(STREAM_TILES))
            secs, msgs, swept = await _pass(rt, sweeper)
            print(f"(b) round {r + 1}: 1000 lost tiles: {secs * 1000:.0f} ms, "
                  f"{msgs} NATS messages sent, {swept} re-published")  # fmt: skip
            await rt.js.purge_stream(rt.names.stream(STREAM_TILES))
            await rt.db.request_cancel(job_id)  # out of the next round's snapshot
    finally:
        await rt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tessera-bench-") as tmp,
        Stack(Path(tmp), durable=False) as stack,
    ):
        asyncio.run(run(stack, args.rounds))


if __name__ == "__main__":
    main()
