"""The console's pages: HTML shells rendered by Jinja2 (autoescape on) and the static files.

No farm data passes through these handlers. Each page is a shell (navigation, empty tables, a
canvas) and ``static/console.js`` fills it from the JSON API and the server-sent events of the
same origin (``/api/...``), writing every value with ``textContent``, never as HTML. What the
templates do render from a request (the job id of ``/jobs/{id}``, the filters of ``/?state=
&project=``) goes through Jinja2's autoescaping, and a Content-Security-Policy forbids inline
scripts, so even a missed escape could not run.

Who is asking is the authentication middleware's business (``services.web.auth``): it stores
the caller's role under its ``ROLE_KEY`` (``viewer`` or ``operator``; :data:`ROLE` here) and
hands out the double-submit CSRF token (``csrf_token(request)``; without that middleware,
``request[CSRF]`` or the ``tessera_csrf`` cookie). A page without a role renders for a viewer:
the operator buttons are disabled (the API checks the role again; the buttons only spare a
viewer a 403).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from services.web import auth

__all__ = ["CSRF", "CSRF_COOKIE", "ROLE", "setup"]


ROLE: web.RequestKey[str] = auth.ROLE_KEY
"""The caller's role (``viewer`` or ``operator``), set by the authentication middleware."""
CSRF = web.RequestKey("tessera_page_csrf", str)
"""A CSRF token for the page when no authentication middleware hands one out (tests)."""
CSRF_COOKIE = "tessera_csrf"
"""The cookie holding the CSRF token of a cookie session."""

ROLES = ("viewer", "operator")
HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
#: a job id as the gateway makes them (UUID strings); anything else is a 404 page
_JOB_ID = re.compile(r"[0-9A-Fa-f-]{1,64}")
#: the JSON API's job states, offered by the jobs page's filter
JOB_STATES = (
    "queued", "running", "progressing", "paused", "finalizing", "completed",
    "failed_retryable", "failed_terminal", "dead_lettered", "cancelled",
)  # fmt: skip
#: a filter value longer than this is not echoed back into the page
_MAX_FILTER = 200

#: No inline script or style, nothing from another origin: the pages load exactly
#: console.js and console.css from this service and talk only to it.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_ENV = web.AppKey("tessera_pages_env", jinja2.Environment)


def setup(app: web.Application) -> None:
    """Register the pages (``/``, ``/jobs/{id}``, ``/dlq``, ``/workers``) and ``/static/``."""
    app[_ENV] = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    app.router.add_get("/", jobs_page, name="page-jobs")
    app.router.add_get("/jobs/{job_id}", job_page, name="page-job")
    app.router.add_get("/dlq", dlq_page, name="page-dlq")
    app.router.add_get("/workers", workers_page, name="page-workers")
    app.router.add_static("/static", STATIC, name="static", append_version=True)


def _filter(request: web.Request, name: str) -> str:
    value = request.query.get(name, "")
    return value if len(value) <= _MAX_FILTER else ""


def _csrf(request: web.Request) -> str:
    try:
        return auth.csrf_token(request)
    except KeyError:  # no authentication middleware in this app (the pages' own tests)
        return request.get(CSRF) or request.cookies.get(CSRF_COOKIE, "")


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    """``template`` rendered for this caller, with the security headers."""
    role = request.get(ROLE, "viewer")
    csrf = _csrf(request)
    static = request.app.router["static"]

    def static_url(name: str) -> str:
        return str(static.url_for(filename=name))

    page = (
        request.app[_ENV]
        .get_template(template)
        .render(
            role=role if role in ROLES else "viewer",
            csrf_token=csrf,
            static_url=static_url,
            **context,
        )
    )
    return web.Response(
        text=page, status=status, content_type="text/html", charset="utf-8",
        headers=SECURITY_HEADERS,
    )  # fmt: skip


async def jobs_page(request: web.Request) -> web.Response:
    """The jobs: filters, a page of the list, a submit form."""
    state = _filter(request, "state")
    return render(
        request, "jobs.html", page="jobs", states=JOB_STATES,
        state=state if state in JOB_STATES else "", project=_filter(request, "project"),
    )  # fmt: skip


async def job_page(request: web.Request) -> web.Response:
    """One job: tile grid, preview, timeline, controls."""
    job_id = request.match_info["job_id"]
    if not _JOB_ID.fullmatch(job_id):
        return render(request, "missing.html", status=404, page="missing", what=job_id)
    return render(request, "job.html", page="job", job_id=job_id)


async def dlq_page(request: web.Request) -> web.Response:
    """The dead letters: list, dry-run preview of a requeue, requeue."""
    return render(request, "dlq.html", page="dlq", job_id=_filter(request, "job_id"))


async def workers_page(request: web.Request) -> web.Response:
    """Live workers and the farm's ten operational numbers."""
    return render(request, "workers.html", page="workers")
