"""Who may do what in the web console: tokens, roles, the login cookie and CSRF.

``TESSERA_WEB_TOKEN`` holds comma-separated ``viewer:TOKEN`` and ``operator:TOKEN`` entries (a
bare ``TOKEN`` is an operator's). A **viewer** may read everything; an **operator** may also
change things (every ``POST``/``PUT``). A request proves its role in one of two ways:

- ``Authorization: Bearer TOKEN`` (scripts, ``curl``): no cookie is involved, so no CSRF check;
- the login form (``POST /login`` with ``token``) sets two cookies, both ``SameSite=Strict``:
  ``tessera_session`` (HttpOnly; ``role.expiry.signature``, signed with HMAC-SHA256 keyed by the
  token, so rotating the token ends the sessions it opened) and ``tessera_csrf`` (readable by
  the page's script). Every state-changing request of a cookie session must repeat the
  ``tessera_csrf`` value in the ``X-CSRF-Token`` header (or, for an HTML form, a ``csrf_token``
  field): the double-submit pattern, which a cross-site page cannot do since it cannot read the
  cookie.

No or a bad token: 401 (``WWW-Authenticate: Bearer``) for ``/api/...``, a redirect to the login
page for a page. A viewer changing something, a missing or mismatched CSRF token: 403. Tokens
are compared in constant time.

Empty ``TESSERA_WEB_TOKEN``: :func:`tokens_for` makes up an operator token (logged once at start)
when the service listens on a loopback address, and refuses to start otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

from aiohttp import web

from shared.core.config import WebSettings
from shared.core.errors import ConfigError

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "ROLE_KEY",
    "SESSION_COOKIE",
    "Auth",
    "csrf_token",
    "tokens_for",
]

SESSION_COOKIE = "tessera_session"
CSRF_COOKIE = "tessera_csrf"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
ROLE_KEY = web.RequestKey("tessera_role", str)
_CSRF_KEY = web.RequestKey("tessera_csrf_token", str)
_NEW_CSRF = web.RequestKey("tessera_csrf_new", bool)
_RANK = {"viewer": 0, "operator": 1}
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
PUBLIC_PATHS = frozenset({"/login", "/api/openapi.json", "/favicon.ico"})
PUBLIC_PREFIXES = ("/static/",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tokens_for(settings: WebSettings) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The ``(role, token)`` pairs to accept, and the token made up here (None if configured).

    An empty ``TESSERA_WEB_TOKEN`` is allowed only on a loopback host (ConfigError otherwise).
    """
    configured = settings.tokens()
    if configured:
        return configured, None
    if not _loopback(settings.host):
        raise ConfigError(
            f"TESSERA_WEB_TOKEN is empty and TESSERA_WEB_HOST={settings.host} is not a loopback "
            "address: set tokens (see docs/operations.md) before exposing the console"
        )
    made = secrets.token_urlsafe(24)
    return (("operator", made),), made


def csrf_token(request: web.Request) -> str:
    """The CSRF token a page embeds (``<meta name="csrf-token">``) and its script sends back."""
    return request[_CSRF_KEY]


def role_of(request: web.Request) -> str | None:
    """The role the request proved (``viewer``/``operator``), or None (a public path)."""
    return request.get(ROLE_KEY)


@dataclass(frozen=True)
class _Identity:
    role: str
    cookie: bool


class Auth:
    """Checks tokens and sessions; :meth:`middleware` guards every route."""

    def __init__(self, settings: WebSettings, tokens: tuple[tuple[str, str], ...]) -> None:
        self.settings = settings
        self.tokens = tokens

    # -- tokens and sessions -------------------------------------------------------------

    def role_for_token(self, token: str) -> str | None:
        """The strongest role ``token`` grants, or None (constant time per configured token)."""
        found: str | None = None
        given = token.encode()
        for role, secret in self.tokens:
            if hmac.compare_digest(given, secret.encode()) and (
                found is None or _RANK[role] > _RANK[found]
            ):
                found = role
        return found

    def session_value(self, role: str, now: float | None = None) -> str:
        """A ``tessera_session`` cookie value for ``role`` (signed by the first such token)."""
        expires = int((now or time.time()) + self.settings.session_ttl)
        secret = next(s for r, s in self.tokens if r == role)
        return f"{role}.{expires}.{_sign(secret, role, expires)}"

    def role_for_session(self, value: str, now: float | None = None) -> str | None:
        """The role a session cookie proves, or None (forged, expired, token rotated)."""
        role, _, rest = value.partition(".")
        stamp, _, sig = rest.partition(".")
        if role not in _RANK or not stamp.isdigit() or int(stamp) < (now or time.time()):
            return None
        for r, secret in self.tokens:
            if r == role and hmac.compare_digest(sig, _sign(secret, role, int(stamp))):
                return role
        return None

    def _identify(self, request: web.Request) -> _Identity | None:
        header = request.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            role = self.role_for_token(value.strip())
            return None if role is None else _Identity(role, cookie=False)
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            role = self.role_for_session(cookie)
            return None if role is None else _Identity(role, cookie=True)
        return None

    # -- the middleware ------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """401/403 or the handler; remembers the role and the CSRF token on the request."""
        existing = request.cookies.get(CSRF_COOKIE, "")
        request[_CSRF_KEY] = existing if len(existing) >= 16 else secrets.token_urlsafe(24)
        request[_NEW_CSRF] = request[_CSRF_KEY] != existing
        path = request.path
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        who = self._identify(request)
        if who is None:
            return self._unauthenticated(request)
        request[ROLE_KEY] = who.role
        if request.method not in _SAFE:
            if _RANK[who.role] < _RANK["operator"]:
                return _forbidden(request, "this needs the operator role (the token is a viewer's)")
            if who.cookie and not await self._csrf_ok(request):
                return _forbidden(request, f"missing or wrong CSRF token ({CSRF_HEADER} header)")
        return await handler(request)

    async def _csrf_ok(self, request: web.Request) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = request.headers.get(CSRF_HEADER, "")
        if not sent and request.content_type == "application/x-www-form-urlencoded":
            form = await request.post()  # cached: the handler reads the same form
            value = form.get(CSRF_FIELD)
            sent = value if isinstance(value, str) else ""
        return bool(cookie) and len(cookie) >= 16 and hmac.compare_digest(cookie, sent)

    def _unauthenticated(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/api/"):
            return _error(
                401,
                "unauthorized",
                "a valid token is needed (Authorization: Bearer)",
                {"WWW-Authenticate": 'Bearer realm="tessera"'},
            )
        target = request.rel_url.path_qs
        raise web.HTTPSeeOther(f"/login?next={quote(target, safe='')}")

    def set_session(self, response: web.StreamResponse, role: str, csrf: str) -> None:
        """The login cookies: the session (HttpOnly) and the CSRF token (readable)."""
        secure = bool(self.settings.cookie_secure)
        ttl = self.settings.session_ttl
        response.set_cookie(
            SESSION_COOKIE,
            self.session_value(role),
            max_age=ttl,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=secure,
        )
        response.set_cookie(
            CSRF_COOKIE,
            csrf,
            max_age=ttl,
            path="/",
            httponly=False,
            samesite="Strict",
            secure=secure,
        )

    def clear_session(self, response: web.StreamResponse) -> None:
        """Log out: both cookies removed."""
        response.del_cookie(SESSION_COOKIE, path="/")
        response.del_cookie(CSRF_COOKIE, path="/")

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """A page shown without a CSRF cookie gets one, so its forms and script can send it."""
        page = not request.path.startswith("/api/")
        if (
            page
            and request.get(_NEW_CSRF)
            and request.get(ROLE_KEY)
            and (CSRF_COOKIE not in response.cookies)
        ):
            response.set_cookie(
                CSRF_COOKIE,
                request[_CSRF_KEY],
                max_age=self.settings.session_ttl,
                path="/",
                httponly=False,
                samesite="Strict",
                secure=bool(self.settings.cookie_secure),
            )


def _sign(secret: str, role: str, expires: int) -> str:
    msg = f"tessera-web-session:{role}:{expires}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


def _forbidden(request: web.Request, message: str) -> web.Response:
    return _error(403, "forbidden", message)
