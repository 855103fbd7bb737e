"""Helpers for end-to-end tests: submit, wait for a state, read the result."""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext

from proto import names as n
from proto.api import SubmitRequest
from services.client.api import GatewayUnavailable, TesseraClient
from shared.core.errors import TesseraError
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.objectstore import ObjectStore
from tests.harness import ServiceProcesses
from tests.helpers import eventually

TERMINAL = {"completed", "failed_terminal", "dead_lettered", "cancelled"}


def request(**overrides: Any) -> dict[str, Any]:
    """A small cornell request (64x48, 8 spp, 16 px tiles = 12 tiles)."""
    body: dict[str, Any] = {
        "project": "e2e",
        "scene": "cornell",
        "width": 64,
        "height": 48,
        "spp": 8,
        "tile_size": 16,
    }
    return body | overrides


async def submit(client: TesseraClient, body: dict[str, Any]) -> dict[str, Any]:
    """Submit once the gateway answers (it may still be starting)."""

    async def attempt() -> dict[str, Any] | None:
        try:
            return await client.submit(SubmitRequest(**body))
        except GatewayUnavailable:  # the gateway process is still starting
            return None

    return await eventually(attempt, timeout=60, interval=0.2, what="gateway answers submit")


async def settle(
    client: TesseraClient, job_id: str, procs: ServiceProcesses, *, timeout: float = 90
) -> dict[str, Any]:
    """Wait (bounded) until the job reaches a terminal state; return its status."""

    async def done() -> dict[str, Any] | None:
        status = await client.status(job_id)
        return status if status["state"] in TERMINAL else None

    try:
        return await eventually(done, timeout=timeout, interval=0.2, what=f"job {job_id} settles")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{procs.logs()}") from None


async def result_bytes(objects: ObjectStore, status: dict[str, Any]) -> bytes:
    """The published PNG, verified against its recorded checksum."""
    assert status["state"] == "completed", status
    return await objects.get(status["result_location"], sha256=status["result_sha256"])


async def workers_live(js: JetStreamContext, names: n.Names, nodes: set[str]) -> None:
    """Wait until every worker in ``nodes`` has announced itself, so the dispatcher counts
    their capacity from the first round (a worker still starting would otherwise see a short
    job finished by the others)."""

    async def live() -> bool:
        try:
            workers = await LiveWorkers(js, names.bucket(n.BUCKET_WORKERS)).list()
        except TesseraError:
            return False  # the scheduler has not declared the topology yet
        return nodes <= {w.node for w in workers}

    await eventually(live, timeout=60, what=f"workers {sorted(nodes)} announced")


async def announce_idle_worker(js: JetStreamContext, names: n.Names, threads: int = 6) -> None:
    """A live worker as the dispatcher sees one (``threads`` kernel threads: a window of twice
    as many tiles) that renders nothing, so tiles are released into TILES with no consumer
    taking them. Its key lives one presence TTL (10 s): long enough for the next rounds."""

    async def put() -> bool:
        info = WorkerInfo("idle-worker", threads, 2 * threads, {"tessera": "test"}, "test", 0.0)
        try:
            await LiveWorkers(js, names.bucket(n.BUCKET_WORKERS)).put(info)
        except TesseraError:
            return False  # the scheduler has not declared the topology yet
        return True

    await eventually(put, timeout=30, what="an idle worker announced")
