"""Gateway fixtures: the gateway in-process (a real Runtime on this test's namespace)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from nats.aio.client import Client as NATS

from proto.names import STREAM_JOBS, ApiVerb, Names
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from shared.core.config import Settings
from shared.service.runtime import Runtime


def body(**overrides: Any) -> dict[str, Any]:
    """A small, valid submit body (cornell, 64x48, 4 spp, 16 px tiles)."""
    base: dict[str, Any] = {
        "project": "gw",
        "scene": "cornell",
        "width": 64,
        "height": 48,
        "spp": 4,
        "tile_size": 16,
    }
    return base | overrides


@pytest.fixture
async def runtime(settings: Settings) -> AsyncIterator[Runtime]:
    """A gateway Runtime (NATS, topology, PostgreSQL, object store) for this test."""
    rt = await Runtime.open(settings, "gateway")
    try:
        yield rt
    finally:
        await rt.close()


@pytest.fixture
async def gateway(runtime: Runtime) -> AsyncIterator[Gateway]:
    """A started gateway; stopped after the test."""
    gw = Gateway(runtime)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(5.0)


@pytest.fixture
def names(namespace: str) -> Names:
    """This test's names."""
    return Names(namespace)


@pytest.fixture
def client(nc: NATS, names: Names) -> TesseraClient:
    """An API client on this test's namespace."""
    return TesseraClient(nc, names, timeout=10)


async def raw_request(
    nc: NATS, names: Names, verb: ApiVerb, data: bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """Send raw bytes to a verb; the reply as parsed JSON (``ok`` kept)."""
    msg = await nc.request(names.api_subject(verb), data, timeout=10, headers=headers)
    parsed: dict[str, Any] = orjson.loads(msg.data)
    return parsed


async def jobs_messages(rt: Runtime) -> int:
    """Messages currently in this test's JOBS stream."""
    info = await rt.js.stream_info(rt.names.stream(STREAM_JOBS))
    return info.state.messages
