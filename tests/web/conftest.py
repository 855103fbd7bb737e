"""Web fixtures: the web application on a real port, in front of a real gateway.

The gateway runs in-process on this test's namespace (``tests/gateway/conftest.py``'s fixtures);
the web application is :func:`services.web.app.build_app` served by aiohttp's test server on a
loopback port and reached with a real HTTP client. Tokens: :data:`VIEWER` and :data:`OPERATOR`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.client import Client as NATS

from services.client.api import TesseraClient
from services.web.app import build_app
from shared.core.config import Settings, WebSettings
from tests.e2e.conftest import e2e_env  # noqa: F401
from tests.gateway.conftest import body, client, gateway, names, runtime  # noqa: F401

VIEWER = "viewer-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}


def web_settings(settings: Settings, **web: Any) -> Settings:
    """``settings`` with the test tokens and fast heartbeats (and ``web`` overrides)."""
    group = WebSettings(token=f"viewer:{VIEWER},operator:{OPERATOR}", heartbeat=0.2, **web)
    return dataclasses.replace(settings, web=group)


async def serve(settings: Settings, api: TesseraClient, nc: NATS) -> TestClient[Any, Any]:
    """A started HTTP client of a fresh web application (close it after the test)."""
    http: TestClient[Any, Any] = TestClient(TestServer(build_app(settings, api, nc)))
    await http.start_server()
    return http


@pytest.fixture
async def http(
    settings: Settings,
    gateway: object,  # noqa: F811
    client: TesseraClient,  # noqa: F811
    nc: NATS,
) -> AsyncIterator[TestClient[Any, Any]]:
    """An HTTP client of the web application, in front of this test's gateway."""
    web = await serve(web_settings(settings), client, nc)
    try:
        yield web
    finally:
        await web.close()


__all__ = ["AS_OPERATOR", "AS_VIEWER", "OPERATOR", "VIEWER", "body", "serve", "web_settings"]
