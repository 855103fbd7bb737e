"""The HTTP API against a real gateway: every route's happy path and error mapping, auth, CSRF,
server-sent events, and a streamed upload in bounded memory.

The five console verbs (``job.tiles``, ``job.timeline``, ``job.preview``, ``workers``, ``farm``)
are built by the gateway side in parallel; until then their routes are checked against a NATS
responder standing in for that verb on a namespace without a gateway: the route forwards the
body it should and maps the reply (ok or error) as it should.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import os
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from aiohttp import ClientPayloadError, ClientResponse, FormData
from aiohttp.test_utils import TestClient
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from proto.assets import AssetFile, Manifest
from proto.limits import ASSET_CHUNK_BYTES, MAX_REQUEST_BYTES
from proto.messages import JobEvent, TileDone
from proto.names import ApiVerb, EventKind, Names
from proto.replies import ApiError, ErrorCode, error_reply, ok_reply
from services.client.api import TesseraClient
from services.gateway.app import Gateway
from services.web.api import raise_for
from services.web.app import build_app
from services.web.auth import Auth
from shared.core.config import Settings, WebSettings
from shared.core.errors import ConfigError
from shared.core.lifecycle import JobTrigger
from shared.objectstore import sha256_hex
from shared.service.runtime import Runtime
from tests.gateway.results import completed_job
from tests.harness import ServiceProcesses
from tests.web.conftest import AS_OPERATOR, AS_VIEWER, OPERATOR, VIEWER, body, serve, web_settings

Http = TestClient[Any, Any]


async def json_of(response: ClientResponse, status: int) -> Any:
    text = await response.text()
    assert response.status == status, text
    return orjson.loads(text)


async def error_of(response: ClientResponse, status: int, code: str) -> str:
    parsed = await json_of(response, status)
    assert parsed["error"]["code"] == code, parsed
    message: str = parsed["error"]["message"]
    return message


async def submitted(http: Http, **overrides: Any) -> str:
    reply = await json_of(
        await http.post("/api/jobs", json=body(**overrides), headers=AS_OPERATOR), 201
    )
    job_id: str = reply["job_id"]
    return job_id


# ------------------------------------------------------------------------------ jobs


async def test_submit_status_list_and_steering_a_job(http: Http) -> None:
    first = await json_of(await http.post("/api/jobs", json=body(), headers=AS_OPERATOR), 201)
    assert first["created"] is True and first["state"] == "queued"
    again = await json_of(await http.post("/api/jobs", json=body(), headers=AS_OPERATOR), 200)
    assert again["job_id"] == first["job_id"] and again["duplicate"] is True
    job = first["job_id"]
    status = await json_of(await http.get(f"/api/jobs/{job}", headers=AS_VIEWER), 200)
    assert status["job_id"] == job and status["project"] == "gw" and "ok" not in status
    listed = await json_of(await http.get("/api/jobs", headers=AS_VIEWER), 200)
    assert [j["job_id"] for j in listed["jobs"]] == [job] and listed["next_cursor"] is None
    mine = await json_of(
        await http.get("/api/jobs?project=gw&state=queued", headers=AS_VIEWER), 200
    )
    assert [j["job_id"] for j in mine["jobs"]] == [job]
    other = await json_of(await http.get("/api/jobs?project=nope", headers=AS_VIEWER), 200)
    assert other["jobs"] == []
    moved = await http.post(f"/api/jobs/{job}/priority", json={"priority": 80}, headers=AS_OPERATOR)
    assert (await json_of(moved, 200))["priority"] == 80
    paused = await json_of(await http.post(f"/api/jobs/{job}/pause", headers=AS_OPERATOR), 200)
    assert paused["state"] == "paused"
    resumed = await json_of(await http.post(f"/api/jobs/{job}/resume", headers=AS_OPERATOR), 200)
    assert resumed["job_id"] == job
    cancelled = await json_of(await http.post(f"/api/jobs/{job}/cancel", headers=AS_OPERATOR), 200)
    assert cancelled["state"] == "cancelled" and cancelled["cancel_requested"] is True
    # a cancelled job cannot be retried: the gateway's illegal_state is 409
    await error_of(
        await http.post(f"/api/jobs/{job}/retry", headers=AS_OPERATOR), 409, "illegal_state"
    )


async def test_a_failed_job_is_retried(http: Http, runtime: Runtime) -> None:
    job = await submitted(http)
    for trigger in (JobTrigger.TILES_PLANNED, JobTrigger.TERMINAL_FAILURE):
        await runtime.db.transition_job(job, trigger)
    retried = await json_of(await http.post(f"/api/jobs/{job}/retry", headers=AS_OPERATOR), 200)
    assert retried["generation"] == 1 and retried["state"] == "queued"


async def test_a_project_filter_pages_within_the_limit(http: Http) -> None:
    mine = [await submitted(http, frame=i) for i in range(3)]
    await submitted(http, project="other")  # newest: the first page has none of mine
    page = await json_of(await http.get("/api/jobs?project=gw&limit=1", headers=AS_VIEWER), 200)
    seen = [j["job_id"] for j in page["jobs"]]
    while page["next_cursor"]:
        after = f"/api/jobs?project=gw&limit=1&after={page['next_cursor']}"
        page = await json_of(await http.get(after, headers=AS_VIEWER), 200)
        assert len(page["jobs"]) <= 1
        seen += [j["job_id"] for j in page["jobs"]]
    assert seen == mine[::-1]


async def test_paging_follows_after(http: Http) -> None:
    jobs = [await submitted(http, frame=i) for i in range(3)]
    page = await json_of(await http.get("/api/jobs?limit=2", headers=AS_VIEWER), 200)
    assert len(page["jobs"]) == 2 and page["next_cursor"]
    rest = await http.get(f"/api/jobs?limit=2&after={page['next_cursor']}", headers=AS_VIEWER)
    seen = [j["job_id"] for j in page["jobs"] + (await json_of(rest, 200))["jobs"]]
    assert sorted(seen) == sorted(jobs)


async def test_gateway_errors_become_http_statuses(http: Http) -> None:
    missing = "0190a0b0-0000-7000-8000-000000000000"
    await error_of(await http.get(f"/api/jobs/{missing}", headers=AS_VIEWER), 404, "not_found")
    await error_of(await http.get("/api/jobs/not!a!token", headers=AS_VIEWER), 400, "invalid")
    await error_of(await http.get("/api/jobs?limit=lots", headers=AS_VIEWER), 400, "bad_request")
    await error_of(await http.get("/api/jobs?limit=0", headers=AS_VIEWER), 400, "invalid")
    await error_of(await http.get("/api/jobs?state=nap", headers=AS_VIEWER), 400, "invalid")
    await error_of(await http.post("/api/jobs", json={}, headers=AS_OPERATOR), 400, "bad_request")
    await error_of(await http.post("/api/jobs", data=b"{", headers=AS_OPERATOR), 400, "bad_request")
    await error_of(
        await http.post("/api/jobs", json=body(width=0), headers=AS_OPERATOR), 400, "invalid"
    )
    await error_of(
        await http.post(f"/api/jobs/{missing}/cancel", headers=AS_OPERATOR), 404, "not_found"
    )
    job = await submitted(http)
    await error_of(
        await http.post(f"/api/jobs/{job}/priority", json=[1], headers=AS_OPERATOR),
        400,
        "bad_request",
    )
    await error_of(
        await http.post(f"/api/jobs/{job}/priority", json={"priority": 101}, headers=AS_OPERATOR),
        400,
        "invalid",
    )
    await error_of(
        await http.post(
            f"/api/jobs/{job}/priority", json={"job_id": job, "priority": 1}, headers=AS_OPERATOR
        ),
        400,
        "bad_request",
    )
    huge = b'{"project": "' + b"x" * MAX_REQUEST_BYTES + b'"}'
    response = await http.post("/api/jobs", data=io.BytesIO(huge), headers=AS_OPERATOR)
    await error_of(response, 413, "too_large")
    await error_of(await http.get("/api/nothing-here", headers=AS_VIEWER), 404, "not_found")
    await error_of(await http.delete("/api/jobs", headers=AS_OPERATOR), 405, "method_not_allowed")


def test_busy_is_429_with_retry_after_and_every_code_has_a_status() -> None:
    busy = raise_for(ApiError(ErrorCode.BUSY, "full", retry_after=2.4)).response()
    assert busy.status == 429 and busy.headers["Retry-After"] == "2"
    statuses = {code: raise_for(ApiError(code, "x")).status for code in ErrorCode}
    assert statuses == {
        ErrorCode.BAD_REQUEST: 400,
        ErrorCode.INVALID: 400,
        ErrorCode.NOT_FOUND: 404,
        ErrorCode.CONFLICT: 409,
        ErrorCode.ILLEGAL_STATE: 409,
        ErrorCode.BUSY: 429,
        ErrorCode.UNAVAILABLE: 503,
        ErrorCode.INTERNAL: 500,
    }


async def test_no_gateway_is_503_unavailable(settings: Settings, nc: NATS) -> None:
    alone = TesseraClient(nc, Names("nogateway"), timeout=0.5)
    http = await serve(web_settings(settings), alone, nc)
    try:
        response = await http.get("/api/jobs", headers=AS_VIEWER)
        await error_of(response, 503, "unavailable")
        assert response.headers["Retry-After"] == "1"
    finally:
        await http.close()


async def test_results_stream_from_the_gateway_chunks(
    http: Http, runtime: Runtime, client: TesseraClient
) -> None:
    png = os.urandom(3 * 2**20 + 17)  # more than one result chunk of the gateway
    floats = os.urandom(1000)
    job = await completed_job(runtime, client, png, floats)
    response = await http.get(f"/api/jobs/{job}/image.png", headers=AS_VIEWER)
    assert response.status == 200 and response.content_type == "image/png"
    assert await response.read() == png
    assert response.headers["ETag"] == f'"{sha256_hex(png)}"'
    again = await http.get(
        f"/api/jobs/{job}/image.png",
        headers=AS_VIEWER | {"If-None-Match": response.headers["ETag"]},
    )
    assert again.status == 304
    npy = await http.get(f"/api/jobs/{job}/image.npy", headers=AS_VIEWER)
    assert npy.status == 200 and await npy.read() == floats
    queued = await submitted(http, frame=9)
    await error_of(
        await http.get(f"/api/jobs/{queued}/image.png", headers=AS_VIEWER), 409, "illegal_state"
    )


# ------------------------------------------------------------------------------ dlq, projects


async def test_dead_letter_routes(http: Http) -> None:
    page = await json_of(await http.get("/api/dlq", headers=AS_VIEWER), 200)
    assert page == {"dead_letters": [], "next_cursor": None}
    await error_of(await http.get("/api/dlq/1", headers=AS_VIEWER), 404, "not_found")
    await error_of(await http.get("/api/dlq/first", headers=AS_VIEWER), 400, "bad_request")
    plan = await http.post("/api/dlq/requeue", json={"dry_run": True}, headers=AS_OPERATOR)
    assert (await json_of(plan, 200))["dry_run"] is True
    purge = await http.post(
        "/api/dlq/purge", json={"all": True, "dry_run": True}, headers=AS_OPERATOR
    )
    assert (await json_of(purge, 200))["purged"] == 0
    await error_of(await http.post("/api/dlq/purge", headers=AS_OPERATOR), 400, "invalid")
    await error_of(
        await http.post("/api/dlq/requeue", json={"rate": 0}, headers=AS_OPERATOR), 400, "invalid"
    )


async def test_project_routes(http: Http) -> None:
    put = await http.put(
        "/api/projects/shots", json={"weight": 2.5, "max_in_flight": 4}, headers=AS_OPERATOR
    )
    assert await json_of(put, 200) == {
        "name": "shots",
        "weight": 2.5,
        "max_in_flight": 4,
        "actor": "web",
    }
    shown = await json_of(await http.get("/api/projects/shots", headers=AS_VIEWER), 200)
    assert shown["project"]["weight"] == 2.5 and shown["project"]["configured"] is True
    listed = await json_of(await http.get("/api/projects", headers=AS_VIEWER), 200)
    assert "shots" in [p["name"] for p in listed["projects"]]
    await error_of(await http.get("/api/projects/never", headers=AS_VIEWER), 404, "not_found")
    await error_of(
        await http.put("/api/projects/shots", json={"weight": -1}, headers=AS_OPERATOR),
        400,
        "invalid",
    )
    await error_of(
        await http.put("/api/projects/shots", json={"name": "x", "weight": 1}, headers=AS_OPERATOR),
        400,
        "bad_request",
    )


# ------------------------------------------------------------------------------ console verbs

Responder = Callable[[str, dict[str, Any]], bytes]


async def stand_in(nc: NATS, names: Names, verb: str, answer: Responder) -> list[dict[str, Any]]:
    """A NATS responder for ``verb`` (no gateway on ``names``); the bodies it was sent."""
    seen: list[dict[str, Any]] = []

    async def on_request(msg: Msg) -> None:
        parsed = orjson.loads(msg.data)
        seen.append(parsed)
        await msg.respond(answer(verb, parsed))

    await nc.subscribe(names.api_subject(ApiVerb(verb)), cb=on_request)
    await nc.flush()
    return seen


@pytest.fixture
async def lone(settings: Settings, nc: NATS) -> AsyncIterator[tuple[Http, Names]]:
    """The web application on a namespace without a gateway (stand-ins answer)."""
    names = Names(f"{settings.deployment.namespace}lone")
    http = await serve(web_settings(settings), TesseraClient(nc, names, timeout=2), nc)
    try:
        yield http, names
    finally:
        await http.close()


JOB = "0190a0b0-0000-7000-8000-000000000001"


async def test_console_verbs_forward_their_bodies_and_answer_the_replies(
    lone: tuple[Http, Names], nc: NATS
) -> None:
    http, names = lone
    png = b"\x89PNG-not-really"
    replies: dict[str, dict[str, Any]] = {
        "job.tiles": {"job_id": JOB, "tiles": [{"index": 0, "state": "queued"}]},
        "job.timeline": {"job_id": JOB, "events": [], "next_before_id": None},
        "job.preview": {
            "job_id": JOB,
            "version": 7,
            "content_type": "image/png",
            "data_b64": base64.b64encode(png).decode(),
        },
        "workers": {"workers": [{"node": "w1"}]},
        "farm": {"queue_depth": 3, "window_s": 60},
    }
    seen = {v: await stand_in(nc, names, v, lambda v, b: ok_reply(**replies[v])) for v in replies}
    tiles = await json_of(await http.get(f"/api/jobs/{JOB}/tiles", headers=AS_VIEWER), 200)
    assert tiles == replies["job.tiles"]
    line = await http.get(f"/api/jobs/{JOB}/timeline?limit=5&before_id=9", headers=AS_VIEWER)
    assert await json_of(line, 200) == replies["job.timeline"]
    preview = await http.get(f"/api/jobs/{JOB}/preview.png?max_edge=64", headers=AS_VIEWER)
    assert preview.status == 200 and await preview.read() == png
    assert preview.headers["ETag"] == '"7"' and preview.headers["Cache-Control"] == "no-cache"
    same = await http.get(
        f"/api/jobs/{JOB}/preview.png?max_edge=64", headers=AS_VIEWER | {"If-None-Match": '"7"'}
    )
    assert same.status == 304
    assert (
        await json_of(await http.get("/api/workers", headers=AS_VIEWER), 200) == replies["workers"]
    )
    farm = await json_of(await http.get("/api/farm?window=60", headers=AS_VIEWER), 200)
    assert farm == replies["farm"]
    assert seen["job.tiles"] == [{"job_id": JOB}]
    assert seen["job.timeline"] == [{"job_id": JOB, "limit": 5, "before_id": 9}]
    assert seen["job.preview"] == [{"job_id": JOB, "max_edge": 64}] * 2
    assert seen["workers"] == [{}] and seen["farm"] == [{"window": 60}]


async def test_console_verbs_map_errors_and_absence(lone: tuple[Http, Names], nc: NATS) -> None:
    http, names = lone
    await stand_in(
        nc, names, "job.tiles", lambda v, b: error_reply(ErrorCode.NOT_FOUND, "no such job")
    )
    await stand_in(
        nc,
        names,
        "job.timeline",
        lambda v, b: error_reply(ErrorCode.INVALID, "limit: 0 is outside"),
    )
    await stand_in(
        nc, names, "farm", lambda v, b: error_reply(ErrorCode.BUSY, "full", retry_after=3)
    )
    await error_of(await http.get(f"/api/jobs/{JOB}/tiles", headers=AS_VIEWER), 404, "not_found")
    await error_of(
        await http.get(f"/api/jobs/{JOB}/timeline?limit=0", headers=AS_VIEWER), 400, "invalid"
    )
    await error_of(
        await http.get(f"/api/jobs/{JOB}/timeline?limit=x", headers=AS_VIEWER), 400, "bad_request"
    )
    busy = await http.get("/api/farm", headers=AS_VIEWER)
    await error_of(busy, 429, "busy")
    assert busy.headers["Retry-After"] == "3"
    # nothing serves workers or job.preview here: no responders until the timeout, then 503
    await error_of(await http.get("/api/workers", headers=AS_VIEWER), 503, "unavailable")
    await error_of(
        await http.get(f"/api/jobs/{JOB}/preview.png", headers=AS_VIEWER), 503, "unavailable"
    )


# ------------------------------------------------------------------------------ auth


async def test_tokens_and_roles(http: Http) -> None:
    response = await http.get("/api/jobs")
    await error_of(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    await error_of(
        await http.get("/api/jobs", headers={"Authorization": "Bearer wrong-token"}),
        401,
        "unauthorized",
    )
    await error_of(
        await http.get("/api/jobs", headers={"Authorization": f"Basic {OPERATOR}"}),
        401,
        "unauthorized",
    )
    assert (await http.get("/api/jobs", headers=AS_VIEWER)).status == 200
    await error_of(await http.post("/api/jobs", json=body(), headers=AS_VIEWER), 403, "forbidden")
    await error_of(
        await http.put("/api/projects/p", json={"weight": 1}, headers=AS_VIEWER), 403, "forbidden"
    )
    assert (await http.get("/api/openapi.json")).status == 200  # the document is public
    page = await http.get("/jobs/x?a=1", allow_redirects=False)
    where = urlsplit(page.headers["Location"])
    assert page.status == 303 and where.path == "/login"
    assert parse_qs(where.query) == {"next": ["/jobs/x?a=1"]}


def cookies_of(response: ClientResponse) -> dict[str, str]:
    return {name: morsel.value for name, morsel in response.cookies.items()}


async def login(http: Http, token: str) -> tuple[ClientResponse, dict[str, str]]:
    form = FormData({"token": token, "next": "/dlq"})
    response = await http.post("/login", data=form, allow_redirects=False)
    http.session.cookie_jar.clear()  # each request below says which cookies it sends
    return response, cookies_of(response)


async def test_login_cookie_and_csrf_double_submit(http: Http) -> None:
    failed, _ = await login(http, "not-a-token")
    assert failed.status == 401 and "not valid" in await failed.text()
    response, jar = await login(http, OPERATOR)
    assert response.status == 303 and response.headers["Location"] == "/dlq"
    session = response.cookies["tessera_session"]
    assert session["httponly"] and session["samesite"] == "Strict"
    assert response.cookies["tessera_csrf"]["samesite"] == "Strict"
    assert not response.cookies["tessera_csrf"]["httponly"]  # the page's script reads it
    cookie = "; ".join(f"{k}={v}" for k, v in jar.items())
    job = await submitted(http)
    assert (await http.get(f"/api/jobs/{job}", headers={"Cookie": cookie})).status == 200
    cancel = f"/api/jobs/{job}/cancel"
    await error_of(await http.post(cancel, headers={"Cookie": cookie}), 403, "forbidden")
    await error_of(
        await http.post(cancel, headers={"Cookie": cookie, "X-CSRF-Token": "x" * 32}),
        403,
        "forbidden",
    )
    ok = await http.post(cancel, headers={"Cookie": cookie, "X-CSRF-Token": jar["tessera_csrf"]})
    assert (await json_of(ok, 200))["state"] == "cancelled"
    # an HTML form may send the token as a field instead of the header
    form = FormData({"csrf_token": jar["tessera_csrf"]})
    second = f"/api/jobs/{await submitted(http, frame=2)}/cancel"
    assert (await http.post(second, data=form, headers={"Cookie": cookie})).status == 200
    # Bearer requests carry no cookie, so no CSRF token is asked of them
    third = f"/api/jobs/{await submitted(http, frame=3)}/cancel"
    assert (await http.post(third, headers=AS_OPERATOR)).status == 200
    # a forged or tampered session is no session
    _, stamp, sig = jar["tessera_session"].split(".")
    forged = f"tessera_session=operator.{int(stamp) + 10**6}.{sig}"
    await error_of(await http.get("/api/jobs", headers={"Cookie": forged}), 401, "unauthorized")
    out = await http.post(
        "/logout",
        headers={"Cookie": cookie, "X-CSRF-Token": jar["tessera_csrf"]},
        allow_redirects=False,
    )
    assert out.status == 303 and out.cookies["tessera_session"].value == ""


async def test_a_viewer_session_cannot_change_anything(http: Http) -> None:
    _, jar = await login(http, VIEWER)
    cookie = "; ".join(f"{k}={v}" for k, v in jar.items())
    headers = {"Cookie": cookie, "X-CSRF-Token": jar["tessera_csrf"]}
    assert (await http.get("/api/dlq", headers=headers)).status == 200
    await error_of(
        await http.post("/api/dlq/purge", json={"all": True}, headers=headers), 403, "forbidden"
    )


def test_a_session_expires_and_names_its_role() -> None:
    auth = Auth(WebSettings(session_ttl=60), (("viewer", VIEWER), ("operator", OPERATOR)))
    value = auth.session_value("viewer", now=1000.0)
    assert auth.role_for_session(value, now=1059.0) == "viewer"
    assert auth.role_for_session(value, now=1061.0) is None
    assert auth.role_for_session(value.replace("viewer", "operator", 1), now=1000.0) is None
    rotated = Auth(WebSettings(session_ttl=60), (("viewer", "another-viewer-token-xyz"),))
    assert rotated.role_for_session(value, now=1000.0) is None  # a new token ends the sessions


def test_tokens_are_checked_and_an_empty_one_is_loopback_only(settings: Settings) -> None:
    with pytest.raises(ConfigError, match="16"):
        Settings.from_env(settings.to_env() | {"TESSERA_WEB_TOKEN": "viewer:short"})
    open_host = web_settings(settings)
    open_host = dataclasses.replace(
        open_host, web=dataclasses.replace(open_host.web, token="", host="0.0.0.0")
    )
    with pytest.raises(ConfigError, match="loopback"):
        build_app(open_host, None, None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ events


class Sse:
    """Reads a server-sent-events response frame by frame (each read bounded)."""

    def __init__(self, response: ClientResponse) -> None:
        self.response = response

    async def frame(self, timeout: float = 10.0) -> dict[str, str] | None:
        """The next frame's fields (comments as ``comment``); None at the end of the stream."""
        fields: dict[str, str] = {}
        while True:
            try:
                raw = await asyncio.wait_for(self.response.content.readline(), timeout)
            except ClientPayloadError:  # the server cut the connection
                return None
            if not raw:
                return None
            line = raw.decode().rstrip("\n")
            if not line:
                return fields
            name, _, value = line.partition(":")
            fields[name or "comment"] = value.strip()

    async def until(self, event: str, timeout: float = 10.0) -> dict[str, Any]:
        """The data of the next frame of kind ``event`` (others skipped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            frame = await self.frame(max(0.01, deadline - loop.time()))
            assert frame is not None, f"the stream ended before an {event!r} event"
            if frame.get("event") == event:
                data: dict[str, Any] = orjson.loads(frame["data"])
                return data


async def test_events_reach_every_stream_and_heartbeats_keep_it_open(
    http: Http, nc: NATS, names: Names
) -> None:
    job = await submitted(http)
    everything = await http.get("/api/events", headers=AS_VIEWER)
    assert everything.status == 200 and everything.content_type == "text/event-stream"
    one = await http.get(f"/api/jobs/{job}/events", headers=AS_VIEWER)
    assert one.status == 200
    all_stream, job_stream = Sse(everything), Sse(one)
    assert await all_stream.frame() == {
        "retry": "2000",
        "comment": "ready",
    }  # subscribed from here on
    assert await job_stream.frame() == {"retry": "2000", "comment": "ready"}
    paused = JobEvent(job, EventKind.JOB_PAUSED, generation=0, detail="by <script>")
    await nc.publish(names.event_subject(job, EventKind.JOB_PAUSED), paused.encode())
    done = TileDone(job, 3, "attempt-1", "tiles/x", "ab" * 32)
    await nc.publish(names.event_subject(job, EventKind.TILE_DONE), done.encode())
    other = JobEvent("another-job", EventKind.JOB_COMPLETED)
    await nc.publish(names.event_subject("another-job", EventKind.JOB_COMPLETED), other.encode())
    got = await all_stream.until("job-paused")
    assert got == {
        "job_id": job,
        "kind": "job-paused",
        "generation": 0,
        "detail": "by <script>",
        "result_key": None,
    }
    assert (await all_stream.until("tile-done"))["tile_index"] == 3
    assert (await all_stream.until("job-completed"))["job_id"] == "another-job"
    assert (await job_stream.until("job-paused"))["job_id"] == job
    assert (await job_stream.until("tile-done"))["attempt_id"] == "attempt-1"
    # the other job's event never comes here: past the job's tile frames (a first full frame,
    # then deltas only when tiles change) the next is a heartbeat
    frame = await job_stream.frame()
    while frame is not None and frame.get("event") == "tiles":
        frame = await job_stream.frame()
    assert frame == {"comment": "heartbeat"}
    await error_of(
        await http.get("/api/jobs/0190a0b0-0000-7000-8000-000000000009/events", headers=AS_VIEWER),
        404,
        "not_found",
    )
    everything.close()
    one.close()


async def test_a_job_stream_sends_tile_deltas(lone: tuple[Http, Names], nc: NATS) -> None:
    http, names = lone
    tiles = [{"index": i, "state": "queued", "samples_done": 0} for i in range(3)]
    await stand_in(nc, names, "status", lambda v, b: ok_reply(job_id=JOB, state="running"))
    await stand_in(
        nc,
        names,
        "job.tiles",
        lambda v, b: ok_reply(job_id=JOB, width=48, tile_size=16, tiles=tiles),
    )
    stream = await http.get(f"/api/jobs/{JOB}/events", headers=AS_VIEWER)
    sse = Sse(stream)
    first = await sse.until("tiles")
    assert first["full"] is True and first["tiles"] == tiles and first["width"] == 48
    tiles[1] = {"index": 1, "state": "progressing", "samples_done": 4}
    delta = await sse.until("tiles")
    assert delta == {
        "job_id": JOB,
        "width": 48,
        "tile_size": 16,
        "full": False,
        "tiles": [tiles[1]],
    }
    stream.close()


async def test_a_client_that_falls_behind_is_dropped(
    settings: Settings, http: Http, client: TesseraClient, nc: NATS, names: Names
) -> None:
    small = await serve(web_settings(settings, sse_queue=4), client, nc)
    try:
        response = await small.get("/api/events", headers=AS_VIEWER)
        sse = Sse(response)
        assert await sse.frame() == {"retry": "2000", "comment": "ready"}
        event = JobEvent("burst", EventKind.JOB_RESUMED, detail="x" * 4000).encode()
        subject = names.event_subject("burst", EventKind.JOB_RESUMED)
        for _ in range(2000):  # one burst, faster than the stream is written
            await nc.publish(subject, event)
        await nc.flush()

        async def ended() -> bool:
            while (frame := await sse.frame()) is not None:  # heartbeats would go on forever
                assert frame.get("event") in ("job-resumed", None), frame
            return True

        assert await asyncio.wait_for(ended(), 20), "the stream of a client behind ends"
    finally:
        await small.close()


# ------------------------------------------------------------------------------ assets


async def test_an_upload_becomes_an_asset(http: Http, client: TesseraClient) -> None:
    scene = b'#include "colors.inc"\nsphere { 0, 1 }\n'
    raw = await http.post(
        "/api/assets?path=scene.pov&renderer=povray", data=scene, headers=AS_OPERATOR
    )
    reply = await json_of(raw, 200)
    entry = AssetFile("scene.pov", len(scene), sha256_hex(scene), (sha256_hex(scene),))
    expected = Manifest.build("scene.pov", [entry], max_bytes=2**40)
    assert reply["asset"] == sha256_hex(expected.canonical()) and reply["main"] == "scene.pov"
    assert (await client.asset_missing([sha256_hex(scene)]))["missing"] == []
    form = FormData()
    form.add_field("file", b"texture bytes", filename="maps/wood.png")
    form.add_field("file", scene, filename="scene.pov")
    multi = await http.post("/api/assets?main=scene.pov", data=form, headers=AS_OPERATOR)
    assert (await json_of(multi, 200))["files"] == 2
    await error_of(
        await http.post("/api/assets", data=scene, headers=AS_OPERATOR), 400, "bad_request"
    )
    await error_of(
        await http.post("/api/assets?path=../up.pov", data=scene, headers=AS_OPERATOR),
        400,
        "invalid",
    )
    await error_of(
        await http.post("/api/assets?path=a.pov", data=scene, headers=AS_VIEWER), 403, "forbidden"
    )


async def test_an_upload_over_the_gateway_limit_is_refused(
    settings: Settings, nc: NATS, names: Names
) -> None:
    limited = dataclasses.replace(
        settings, gateway=dataclasses.replace(settings.gateway, asset_max_bytes=ASSET_CHUNK_BYTES)
    )
    rt = await Runtime.open(limited, "gateway")
    gw = Gateway(rt)
    await gw.start()
    http = await serve(web_settings(settings), TesseraClient(nc, names), nc)
    try:
        data = b"x" * (ASSET_CHUNK_BYTES + 1)
        big = await http.post(
            "/api/assets?path=big.bin", data=io.BytesIO(data), headers=AS_OPERATOR
        )
        await error_of(big, 413, "too_large")
    finally:
        await http.close()
        await gw.stop(5.0)
        await rt.close()


async def _pieces(total: int, piece: int, digest: Any) -> AsyncIterator[bytes]:
    sent = 0
    block = hashlib.sha256(b"seed").digest() * (piece // 32)
    while sent < total:
        data = block[: min(piece, total - sent)]
        data = sent.to_bytes(8, "big") + data[8:]  # each piece differs: no repeated chunk
        digest.update(data)
        sent += len(data)
        yield data


async def test_a_multi_chunk_upload_is_streamed_in_bounded_memory(
    e2e_env: dict[str, str], tmp_path: Path, settings: Settings, nc: NATS, names: Names
) -> None:
    procs = ServiceProcesses(e2e_env, tmp_path / "logs")  # the gateway's memory is not ours
    try:
        procs.wait_started(procs.start("gateway"))
        http = await serve(web_settings(settings), TesseraClient(nc, names, timeout=30), nc)
        try:
            size = 12 * ASSET_CHUNK_BYTES + 12345
            whole = hashlib.sha256()
            tracemalloc.start()
            try:
                response = await http.post(
                    "/api/assets?path=big.bin",
                    headers=AS_OPERATOR,
                    data=_pieces(size, 64 * 1024, whole),
                )
                reply = await json_of(response, 200)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert reply["size"] == size and reply["files"] == 1
            assert peak < 5 * ASSET_CHUNK_BYTES, f"peak {peak} bytes for a {size}-byte upload"
        finally:
            await http.close()
    finally:
        procs.stop_all()
