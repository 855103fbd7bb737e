"""A lease deleted under a rendering worker is a renewal failure, then a takeover; ``top``."""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from nats.aio.client import Client as NATS

from proto import names as n
from services.client.api import TesseraClient
from shared.core.config import Settings
from shared.devstack.stack import PostgresServer
from shared.metadata import MetadataStore
from shared.nats.presence import LiveWorkers
from shared.objectstore import ObjectStore
from shared.service.runtime import Runtime
from tests.e2e.conftest import reference_png
from tests.e2e.flows import request, result_bytes, settle, submit
from tests.harness import ServiceProcesses
from tests.helpers import eventually, eventually_sync
from tests.ops.conftest import CliRunner, metric, scrape, start_with_port, value, wait_ready


async def test_lost_lease_then_takeover_and_top_shows_the_tile(
    services: ServiceProcesses,
    client: TesseraClient,
    db: MetadataStore,
    objects: ObjectStore,
    nc: NATS,
    e2e_settings: Settings,
    tessera: CliRunner,
) -> None:
    for service in ("gateway", "scheduler", "finalizer"):
        services.start(service)
    worker, port = start_with_port(services, "worker", name="worker-1")
    await wait_ready(port, worker)
    # One tile long enough to be still in flight after the worker's presence names it (a refresh
    # every 2 s), `top` runs and the lease is deleted: a 16x16 tile at 16000 spp finished in
    # about 2 s on a fast day; this one takes about six times as long.
    body = request(width=24, height=16, spp=65536, tile_size=24)
    job_id = (await submit(client, body))["job_id"]

    async def rendering() -> bool:
        tile = await db.get_tile(job_id, 0)
        return tile is not None and tile.samples_done > 0

    await eventually(rendering, timeout=60, what="the tile is rendering")
    names = n.Names(e2e_settings.deployment.namespace)
    live = LiveWorkers(nc.jetstream(), names.bucket(n.BUCKET_WORKERS))

    async def announced() -> bool:  # the worker's next refresh (every 2 s) names the tile
        return any([job_id, 0] in w.current for w in await live.list())

    await eventually(announced, timeout=30, what="the worker announces its tile")
    top = await tessera("top", "--once")
    assert top.status == 0, top.err
    assert names.stream(n.STREAM_TILES) in top.out and "workers" in top.out
    in_flight = top.out.split("IN FLIGHT", 1)[1]
    assert job_id in in_flight and "worker-1" in in_flight, top.out
    workers = top.out.split("WORKERS (1, ", 1)[1].split("IN FLIGHT", 1)[0]
    assert "worker-1" in workers and "tessera/" in workers and f"{job_id[:8]}:0" in workers

    kv = await nc.jetstream().key_value(names.bucket(n.BUCKET_LEASES))
    await kv.delete(n.lease_key_tile(job_id, 0))  # the owner's next renew is refused
    failures = "tessera_lease_renewal_failures_total"

    async def lost() -> bool:
        return await metric(port, failures, kind="tile") == 1

    await eventually(lost, timeout=30, what="the worker counts the lost lease")
    status = await settle(client, job_id, services)
    assert await result_bytes(objects, status) == reference_png(body)
    w = await scrape(port)
    assert value(w, "tessera_lease_takeovers_total") == 1, "the redelivery found the row leased"
    assert value(w, "tessera_tile_attempts_total") == 2
    assert value(w, "tessera_tiles_completed_total") == 1


async def _prepare(env: dict[str, str]) -> None:
    rt = await Runtime.open(Settings.from_env(env), "scheduler")  # schema and streams
    await rt.close()


def _printed(
    top: subprocess.Popen[str], lines: queue.Queue[str], needle: str
) -> Callable[[], bool]:
    """A predicate: ``top`` (still running) printed a line containing ``needle``; the lines read
    up to that one are consumed, so the next wait looks only at what comes after."""

    def check() -> bool:
        assert top.poll() is None, "top exited"
        while True:
            try:
                if needle in lines.get_nowait():
                    return True
            except queue.Empty:
                return False

    return check


def test_live_top_rides_out_a_database_outage(
    settings_env: dict[str, str], server_dir: Path
) -> None:
    """A live ``top`` shows why a frame is missing and carries on; ``--once`` exits 4."""
    pg = PostgresServer(server_dir / "pg", durable=False)
    pg.start()
    env = settings_env | {"TESSERA_DATABASE_URL": pg.dsn}
    top: subprocess.Popen[str] | None = None
    pumping: threading.Thread | None = None
    try:
        asyncio.run(_prepare(env))
        top = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "top", "--interval", "0.2"],
            env=os.environ | env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        out = top.stdout
        assert out is not None

        def pump() -> None:
            for line in out:
                lines.put(line)

        pumping = threading.Thread(target=pump, daemon=True)
        pumping.start()

        eventually_sync(_printed(top, lines, "IN FLIGHT"), timeout=60, what="top shows a frame")
        pg.stop()
        eventually_sync(
            _printed(top, lines, "tessera top: no frame at"), timeout=60, what="top says why not"
        )
        once = subprocess.run(
            [sys.executable, "-m", "services.cli", "top", "--once"],
            env=os.environ | env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert once.returncode == 4 and "Traceback" not in once.stderr, once.stderr
        pg.start()
        eventually_sync(_printed(top, lines, "IN FLIGHT"), timeout=60, what="top carries on")
    finally:
        if top is not None:
            top.kill()
            top.wait(30)
            if pumping is not None:
                pumping.join(30)  # the pipe is at its end once top is gone
            if top.stdout is not None:
                top.stdout.close()
        pg.stop()
