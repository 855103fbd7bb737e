"""The ops endpoint in-process: probes, and the duplicate counter of a real gateway."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from proto.api import SubmitRequest
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from shared.core.config import Settings
from shared.devstack.stack import PostgresServer
from shared.service.metrics import CONTENT_TYPE_LATEST
from shared.service.observability import OpsServer
from shared.service.runtime import Runtime
from tests.helpers import eventually
from tests.ops.conftest import http_get, metric, scrape, value


@pytest.fixture
async def gateway_ops(settings: Settings):
    """A started in-process gateway and its ops endpoint on a free port."""
    rt = await Runtime.open(settings, "gateway")
    gateway = Gateway(rt)
    await gateway.start()
    ops = await OpsServer(rt.metrics, rt.readiness_checks(), rt.log, host="127.0.0.1").start(0)
    try:
        yield rt, ops.port
    finally:
        await ops.close()
        await gateway.stop(5.0)
        await rt.close()


async def test_probes_and_a_duplicate_submit(gateway_ops, nc) -> None:
    rt, port = gateway_ops
    assert await http_get(port, "/healthz") == (200, b"ok\n")
    status, body = await http_get(port, "/readyz")
    assert status == 200, body
    assert orjson.loads(body)["checks"] == {"nats": "ok", "postgres": "ok", "object_store": "ok"}
    assert (await http_get(port, "/nope"))[0] == 404
    client = TesseraClient(nc, rt.names, timeout=10)
    request = SubmitRequest(project="ops", scene="cornell", width=16, height=16, spp=1)
    first = await client.submit(request)
    before = await scrape(port)
    again = await client.submit(request)
    after = await scrape(port)
    assert again["job_id"] == first["job_id"] and again["duplicate"]
    name = "tessera_duplicates_suppressed_total"
    assert value(after, name, source="idempotency_key") == 1 + value(
        before, name, source="idempotency_key"
    )
    # the job is still queued, so its JOBS message went out again under the same Nats-Msg-Id
    assert value(after, name, source="jetstream") == 1 + value(before, name, source="jetstream")


async def test_methods_and_content_types(gateway_ops) -> None:
    _, port = gateway_ops

    def call(method: str, path: str) -> tuple[int, str, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.headers["Content-Type"], r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read()

    status, kind, body = await asyncio.to_thread(call, "GET", "/metrics")
    assert (status, kind) == (200, CONTENT_TYPE_LATEST) and b"tessera_" in body
    assert (await asyncio.to_thread(call, "HEAD", "/metrics"))[::2] == (200, b"")
    status, kind, body = await asyncio.to_thread(call, "GET", "/readyz?verbose=1")
    assert (status, kind) == (200, "application/json") and orjson.loads(body)["ready"]
    assert (await asyncio.to_thread(call, "POST", "/healthz"))[0] == 405
    assert (await asyncio.to_thread(call, "DELETE", "/metrics"))[0] == 405


async def test_an_idle_connection_is_closed_within_seconds(gateway_ops) -> None:
    """A socket that never sends a request (a port scan, a dead scraper) does not stay open."""
    _, port = gateway_ops
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 30) == b"", "closed by the server"
        assert asyncio.get_running_loop().time() - started < 30
    finally:
        writer.close()


async def test_listens_only_on_the_configured_host(settings: Settings) -> None:
    """Bound to 127.0.0.2, the endpoint answers there and not on 127.0.0.1."""
    rt = await Runtime.open(settings, "scheduler")
    ops = await OpsServer(rt.metrics, rt.readiness_checks(), rt.log, host="127.0.0.2").start(0)
    try:

        def get(host: str) -> int:
            with urllib.request.urlopen(f"http://{host}:{ops.port}/healthz", timeout=10) as r:
                return int(r.status)

        assert await asyncio.to_thread(get, "127.0.0.2") == 200
        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(get, "127.0.0.1")
    finally:
        await ops.close()
        await rt.close()
    with pytest.raises(RuntimeError, match="not started"):
        _ = ops.port


async def test_readyz_fails_while_postgres_is_down(
    settings_env: dict[str, str], server_dir: Path
) -> None:
    pg = PostgresServer(server_dir / "pg", durable=False)
    pg.start()
    try:
        settings = Settings.from_env(settings_env | {"TESSERA_DATABASE_URL": pg.dsn})
        rt = await Runtime.open(settings, "worker")
        ops = await OpsServer(rt.metrics, rt.readiness_checks(), rt.log, host="127.0.0.1").start(0)
        try:
            await _readiness(ops.port, expect=200)
            pg.stop()
            body = await _readiness(ops.port, expect=503)
            checks = orjson.loads(body)["checks"]
            assert checks["postgres"] != "ok" and checks["nats"] == "ok", checks
            assert (await http_get(ops.port, "/healthz"))[0] == 200, "alive, just not ready"
            pg.start()
            await _readiness(ops.port, expect=200)
            assert await metric(ops.port, "tessera_tiles_in_flight") == 0
        finally:
            await ops.close()
            await rt.close()
    finally:
        pg.stop()


async def _readiness(port: int, *, expect: int) -> bytes:
    async def probe() -> bytes | None:
        status, body = await http_get(port, "/readyz")
        return body if status == expect else None

    result: bytes = await eventually(probe, timeout=30, interval=0.2, what=f"/readyz {expect}")
    return result
