"""An aiohttp application with only the console's pages, for the page and browser tests.

Authentication is ``services.web.auth``'s job; here a stand-in middleware takes the role and the
CSRF token from test headers (``X-Test-Role``, ``X-Test-Csrf``), so a test can render each page
as a viewer and as an operator without the real service.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from services.web import pages


@web.middleware
async def _identity(request: web.Request, handler: Handler) -> web.StreamResponse:
    if role := request.headers.get("X-Test-Role"):
        request[pages.ROLE] = role
    if csrf := request.headers.get("X-Test-Csrf"):
        request[pages.CSRF] = csrf
    return await handler(request)


def pages_app(*extra: tuple[str, str, Handler]) -> web.Application:
    """The pages, plus ``extra`` routes (method, path, handler)."""
    app = web.Application(middlewares=[_identity])
    pages.setup(app)
    for method, path, handler in extra:
        app.router.add_route(method, path, handler)
    return app


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[TestServer]:
    """``app`` on a free loopback port, stopped afterwards."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()
