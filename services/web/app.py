"""The aiohttp application of ``tessera web``: the API, its document, events, login, pages.

:func:`build_app` wires everything to one :class:`~services.client.api.TesseraClient` (the only
way the web service reaches the farm: the gateway's NATS API) and one NATS connection (for the
events). Middlewares, outermost first: :class:`~services.web.auth.Auth` (401/403/CSRF), then the
error mapping (a gateway error becomes its HTTP status and ``{"error": {...}}``; an unexpected
exception a logged 500 that leaks nothing). The page routes are :mod:`services.web.pages`'s.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson
from aiohttp import web
from nats.aio.client import Client as NATS

from proto.limits import MAX_REQUEST_BYTES
from services.client.api import TesseraClient
from services.web import pages
from services.web.api import (
    CLIENT_KEY,
    EVENT_ROUTES,
    HUB_KEY,
    ROUTES,
    Handler,
    Route,
    WebError,
)
from services.web.auth import Auth, csrf_token, tokens_for
from services.web.events import EventHub
from services.web.openapi import document
from shared.core.config import Settings
from shared.service.logs import Log

__all__ = [
    "AUTH_KEY",
    "GENERATED_TOKEN_KEY",
    "SETTINGS_KEY",
    "all_routes",
    "build_app",
    "settings_from_env",
]

AUTH_KEY = web.AppKey("tessera_auth", Auth)
SETTINGS_KEY = web.AppKey("tessera_settings", Settings)
GENERATED_TOKEN_KEY = web.AppKey("tessera_generated_token", str)
"""The operator token made up because ``TESSERA_WEB_TOKEN`` was empty ("" if it was set)."""
_LOG = Log("tessera.web", service="web")


_NOT_MINE = ("TESSERA_DATABASE_URL", "TESSERA_OBJECT_STORE")


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """The web service's settings: ``env`` without the database and object-store variables
    (a shared ConfigMap may carry them; the web service opens neither)."""
    own = {k: v for k, v in env.items() if k not in _NOT_MINE and not k.startswith("TESSERA_S3_")}
    return Settings.from_env(own, database=False, object_store=False)


def _version() -> str:
    try:
        return version("tessera")
    except PackageNotFoundError:
        return "0+unknown"


def all_routes() -> list[Route]:
    """Every documented route: the JSON API and the event streams."""
    return [*ROUTES, *EVENT_ROUTES]


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except WebError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/api/"):
            raise
        code = _HTTP_CODES.get(exc.status, "bad_request" if exc.status < 500 else "internal")
        response = WebError(exc.status, code, exc.reason).response()
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception:
        _LOG.error("request failed", exc=True, path=request.path, method=request.method)
        return WebError(500, "internal", "internal error (logged by the web service)").response()


_LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/console.css"></head>
<body class="login"><main><h1>Tessera</h1>
<form method="post" action="/login">
<input type="hidden" name="next" value="{next}">
<label>Access token <input type="password" name="token" autocomplete="current-password"
autofocus required></label>
<button type="submit">Log in</button>
<p class="error">{error}</p>
</form></main></body></html>
"""


def _safe_next(raw: Any) -> str:
    target = raw if isinstance(raw, str) else "/"
    return target if target.startswith("/") and not target.startswith("//") else "/"


async def _login_page(request: web.Request) -> web.Response:
    page = _LOGIN.format(next=html.escape(_safe_next(request.query.get("next"))), error="")
    return web.Response(text=page, content_type="text/html")


async def _login(request: web.Request) -> web.Response:
    auth = request.app[AUTH_KEY]
    form = await request.post()
    token, target = form.get("token"), _safe_next(form.get("next"))
    role = auth.role_for_token(token) if isinstance(token, str) else None
    if role is None:
        page = _LOGIN.format(next=html.escape(target), error="That token is not valid.")
        return web.Response(text=page, content_type="text/html", status=401)
    response = web.Response(status=303, headers={"Location": target})
    auth.set_session(response, role, csrf_token(request))
    return response


async def _logout(request: web.Request) -> web.Response:
    response = web.Response(status=303, headers={"Location": "/login"})
    request.app[AUTH_KEY].clear_session(response)
    return response


def build_app(settings: Settings, client: TesseraClient, nc: NATS) -> web.Application:
    """The web service's application (not yet started); raises ConfigError for bad tokens."""
    tokens, made = tokens_for(settings.web)
    auth = Auth(settings.web, tokens)
    app = web.Application(middlewares=[auth.middleware, _errors], client_max_size=MAX_REQUEST_BYTES)
    app[CLIENT_KEY] = client
    app[AUTH_KEY] = auth
    app[SETTINGS_KEY] = settings
    app[GENERATED_TOKEN_KEY] = made or ""
    hub = EventHub(nc, client, settings.web, _LOG)
    app[HUB_KEY] = hub
    routes = all_routes()
    body = orjson.dumps(document(routes, title="Tessera HTTP API", version=_version()))

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    for route in routes:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
    app.router.add_get("/api/openapi.json", openapi)
    app.router.add_get("/login", _login_page)
    app.router.add_post("/login", _login)
    app.router.add_post("/logout", _logout)

    async def stop_streams(app: web.Application) -> None:
        await hub.close()

    app.on_shutdown.append(stop_streams)
    app.on_response_prepare.append(auth.on_prepare)
    pages.setup(app)
    return app
