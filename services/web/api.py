"""The HTTP JSON API: one route table (:data:`ROUTES`), served and documented from it.

Every route calls one gateway verb over NATS (:class:`services.client.api.TesseraClient`) and
answers its reply without ``ok``; the web service keeps no state of its own. The request limits
are the gateway's: a body is at most :data:`proto.limits.MAX_REQUEST_BYTES` (413 above) and is
forwarded as sent, so the gateway's checks (and messages) apply unchanged. Errors::

    {"error": {"code": "<gateway error code>", "message": "..."}}

with the HTTP status :data:`STATUS_OF` gives (``busy`` adds ``Retry-After``). An asset upload
(``POST /api/assets``) is read and sent a chunk (4 MiB) at a time, never held whole.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import orjson
from aiohttp import BodyPartReader, MultipartReader, web

from proto import api as rq
from proto.api import MSGPACK, VERB_REQUESTS
from proto.api_replies import VERB_REPLIES
from proto.assets import AssetFile, Manifest
from proto.names import ApiVerb
from proto.replies import ApiError, ErrorCode
from services.client.api import GatewayUnavailable, RequestTooLarge, TesseraClient
from services.web.errors import WebError
from services.web.events import EventHub
from services.web.openapi import FALLBACK_REPLIES, SchemaSet
from shared.core.errors import DecodeError, ValidationError
from shared.core.lifecycle import JobState

__all__ = [
    "CLIENT_KEY",
    "EVENT_ROUTES",
    "HUB_KEY",
    "ROUTES",
    "STATUS_OF",
    "Param",
    "Route",
    "WebError",
    "raise_for",
]

CLIENT_KEY = web.AppKey("tessera_client", TesseraClient)

STATUS_OF: dict[str, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.INVALID: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.ILLEGAL_STATE: 409,
    ErrorCode.BUSY: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
}
"""The HTTP status of each gateway error code."""

LIST_SCAN_PAGES = 10
"""Gateway pages ``GET /api/jobs?project=`` reads at most to fill one page of that project."""
_PIECE = 256 * 1024
"""Bytes read from an upload at a time (a chunk is filled from these)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def raise_for(exc: Exception) -> WebError:
    """The :class:`WebError` of a failed gateway call."""
    if isinstance(exc, ApiError):
        status = STATUS_OF.get(exc.code, 500)
        retry = exc.retry_after if exc.error_code is ErrorCode.BUSY else None
        return WebError(status, exc.code, exc.message, retry if status == 429 else None)
    if isinstance(exc, GatewayUnavailable):
        return WebError(503, ErrorCode.UNAVAILABLE, str(exc), 1.0)
    if isinstance(exc, RequestTooLarge):
        return WebError(413, "too_large", str(exc))
    if isinstance(exc, DecodeError):
        return WebError(400, ErrorCode.BAD_REQUEST, str(exc))
    if isinstance(exc, ValidationError):
        return WebError(400, ErrorCode.INVALID, str(exc))
    raise exc


async def _call(client: TesseraClient, verb: ApiVerb, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return await client.call(verb, body)
    except (ApiError, GatewayUnavailable, RequestTooLarge) as exc:
        raise raise_for(exc) from None


async def _call_raw(client: TesseraClient, verb: ApiVerb, data: bytes) -> dict[str, Any]:
    try:
        return await client.call_raw(verb, data)
    except (ApiError, GatewayUnavailable, RequestTooLarge) as exc:
        raise raise_for(exc) from None


def _client(request: web.Request) -> TesseraClient:
    return request.app[CLIENT_KEY]


def _int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise WebError(
            400, ErrorCode.BAD_REQUEST, f"{name}: {raw!r:.40} is not an integer"
        ) from None
    if not -(2**63) <= value < 2**63:  # (JSON to the gateway carries 64-bit integers)
        raise WebError(400, ErrorCode.INVALID, f"{name}: {raw:.40} is out of range")
    return value


def _str(request: web.Request, name: str) -> str | None:
    raw = request.query.get(name)
    return None if raw is None or raw == "" else raw


def _bool(request: web.Request, name: str) -> bool | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise WebError(400, ErrorCode.BAD_REQUEST, f"{name}: {raw!r:.40} is not true or false")


async def _body(request: web.Request) -> bytes:
    data = await request.read()  # bounded by the application's client_max_size
    return data if data.strip() else b"{}"


async def _object(request: web.Request) -> dict[str, Any]:
    try:
        parsed = orjson.loads(await _body(request))
    except orjson.JSONDecodeError:
        raise WebError(400, ErrorCode.BAD_REQUEST, "the body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise WebError(400, ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    return parsed


def _json(reply: dict[str, Any], status: int = 200) -> web.Response:
    body = orjson.dumps(reply, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, status=status, content_type="application/json")


# ------------------------------------------------------------------------------ handlers


async def list_jobs(request: web.Request) -> web.Response:
    """A page of jobs, newest first. With ``project``: that project's jobs of the first gateway
    page that has any (reading at most :data:`LIST_SCAN_PAGES` pages), so a page holds at most
    ``limit`` jobs and may hold fewer, even none: follow ``next_cursor`` until it is null."""
    client, project = _client(request), _str(request, "project")
    body: dict[str, Any] = {"state": _str(request, "state"), "limit": _int(request, "limit")}
    cursor = _str(request, "after")
    if project is None:
        return _json(await _call(client, ApiVerb.LIST, body | {"cursor": cursor}))
    jobs: list[dict[str, Any]] = []
    for _ in range(LIST_SCAN_PAGES):
        page = await _call(client, ApiVerb.LIST, body | {"cursor": cursor})
        jobs = [j for j in page["jobs"] if j["project"] == project]
        cursor = page["next_cursor"]
        if jobs or cursor is None:
            break
    return _json({"jobs": jobs, "next_cursor": cursor})


async def submit(request: web.Request) -> web.Response:
    """Submit one frame (the body is the gateway's submit request, forwarded as sent)."""
    reply = await _call_raw(_client(request), ApiVerb.SUBMIT, await _body(request))
    return _json(reply, 201 if reply.get("created") else 200)


def _job(request: web.Request) -> str:
    return request.match_info["id"]


def _job_verb(verb: ApiVerb) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return _json(await _call(_client(request), verb, {"job_id": _job(request)}))

    handler.__name__ = verb.value.replace(".", "_")
    return handler


async def priority(request: web.Request) -> web.Response:
    """Change a job's priority: ``{"priority": 0..100}``."""
    body = await _object(request)
    if "job_id" in body:
        raise WebError(400, ErrorCode.BAD_REQUEST, "job_id: give it in the path, not the body")
    return _json(await _call(_client(request), ApiVerb.PRIORITY, {**body, "job_id": _job(request)}))


async def tiles(request: web.Request) -> web.Response:
    """A job's tiles, a page from ``offset`` (``job.tiles``: follow ``next_offset``)."""
    body = {"job_id": _job(request), "offset": _int(request, "offset")}
    return _json(await _call(_client(request), ApiVerb("job.tiles"), body))


async def timeline(request: web.Request) -> web.Response:
    """The job's audit trail, newest first (``job.timeline``)."""
    body = {
        "job_id": _job(request),
        "limit": _int(request, "limit"),
        "before_id": _int(request, "before_id"),
    }
    return _json(await _call(_client(request), ApiVerb("job.timeline"), body))


async def preview(request: web.Request) -> web.Response:
    """The converging image as a PNG (``job.preview``); ``ETag`` is its version."""
    body = {"job_id": _job(request), "max_edge": _int(request, "max_edge")}
    reply = await _call(_client(request), ApiVerb("job.preview"), body)
    etag = f'"{reply.get("version")}"'
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    data = base64.b64decode(reply.get("data_b64") or "")
    return web.Response(body=data, content_type="image/png", headers=headers)


def _image(kind: rq.ResultKind) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _stream_result(request, kind)

    handler.__name__ = f"image_{kind}"
    return handler


async def _stream_result(request: web.Request, kind: rq.ResultKind) -> web.StreamResponse:
    """A completed job's image, streamed from the gateway's ``result`` chunks (size and sha256
    checked: a mismatch cuts the connection, so a client never keeps a damaged file)."""
    client, job_id = _client(request), _job(request)

    async def chunk(offset: int) -> dict[str, Any]:
        try:
            return await client.result(job_id, kind=kind, inline=True, offset=offset)
        except (ApiError, GatewayUnavailable) as exc:
            raise raise_for(exc) from None

    reply = await chunk(0)
    etag = f'"{reply["sha256"]}"'
    suffix = "png" if kind == "png" else "npy"
    headers = {
        "Content-Type": reply["content_type"],
        "ETag": etag,
        "Cache-Control": "private, max-age=3600",  # a job's result never changes
        "Content-Disposition": f'inline; filename="{job_id}.{suffix}"',
    }
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_length = reply["size"]
    await response.prepare(request)
    digest = hashlib.sha256()
    while True:
        data = base64.b64decode(reply["data_b64"] or "")
        digest.update(data)
        await response.write(data)
        following = reply["next_offset"]
        if following is None or following <= reply["offset"]:
            break
        reply = await chunk(following)
    if digest.hexdigest() != reply["sha256"] and request.transport is not None:
        request.transport.close()  # damaged: the client sees a cut download, not a bad file
    return response


async def dlq_list(request: web.Request) -> web.Response:
    """A page of dead letters, oldest first."""
    body = {
        "job_id": _str(request, "job_id"),
        "limit": _int(request, "limit"),
        "cursor": _str(request, "cursor"),
    }
    return _json(await _call(_client(request), ApiVerb.DLQ_LIST, body))


async def dlq_show(request: web.Request) -> web.Response:
    """One dead letter, with its original payload."""
    raw = request.match_info["seq"]
    if not raw.isdigit():
        raise WebError(400, ErrorCode.BAD_REQUEST, f"seq: {raw!r:.40} is not a positive integer")
    return _json(await _call(_client(request), ApiVerb.DLQ_SHOW, {"seq": int(raw)}))


def _forward(verb: ApiVerb) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return _json(await _call_raw(_client(request), verb, await _body(request)))

    handler.__name__ = verb.value.replace(".", "_")
    return handler


async def projects(request: web.Request) -> web.Response:
    """Every project."""
    body = {"limit": _int(request, "limit")}
    return _json(await _call(_client(request), ApiVerb.PROJECT_LIST, body))


async def project_show(request: web.Request) -> web.Response:
    """One project."""
    body = {"name": request.match_info["name"]}
    return _json(await _call(_client(request), ApiVerb.PROJECT_SHOW, body))


async def project_set(request: web.Request) -> web.Response:
    """Set a project's weight and cap (audited with ``actor``, default ``web``)."""
    body = await _object(request)
    if "name" in body:
        raise WebError(400, ErrorCode.BAD_REQUEST, "name: give it in the path, not the body")
    body = {"actor": "web", **body, "name": request.match_info["name"]}
    return _json(await _call(_client(request), ApiVerb.PROJECT_SET, body))


async def workers(request: web.Request) -> web.Response:
    """The live workers (``workers``)."""
    return _json(await _call(_client(request), ApiVerb("workers"), {}))


async def farm(request: web.Request) -> web.Response:
    """The farm's operational numbers over ``window`` seconds (``farm``)."""
    body = {"window": _int(request, "window")}
    return _json(await _call(_client(request), ApiVerb("farm"), body))


# ------------------------------------------------------------------------------ assets


@dataclass
class _Upload:
    """The state of one streamed asset upload."""

    client: TesseraClient
    chunk_bytes: int
    max_bytes: int
    total: int = 0
    files: list[AssetFile] = field(default_factory=list)

    async def file(self, path: str, pieces: AsyncIterator[bytes]) -> None:
        """Read one file piece by piece into one chunk-sized buffer, sending each chunk as it
        fills (so at most one chunk of the file is held, plus the one on its way)."""
        whole, chunks, size = hashlib.sha256(), [], 0
        buf, filled = bytearray(self.chunk_bytes), 0
        async for piece in pieces:
            size += len(piece)
            self.total += len(piece)
            if self.total > self.max_bytes:
                raise WebError(
                    413,
                    "too_large",
                    f"the asset exceeds the gateway's limit of "
                    f"{self.max_bytes} bytes (TESSERA_ASSET_MAX_BYTES)",
                )
            whole.update(piece)
            rest = memoryview(piece)
            while rest:
                n = min(len(rest), self.chunk_bytes - filled)
                buf[filled : filled + n] = rest[:n]
                rest, filled = rest[n:], filled + n
                if filled == self.chunk_bytes:
                    chunks.append(await self._send(memoryview(buf)))
                    filled = 0
        if filled:
            chunks.append(await self._send(memoryview(buf)[:filled]))
        self.files.append(AssetFile(path, size, whole.hexdigest(), tuple(chunks)))

    async def _send(self, data: memoryview) -> str:
        digest = hashlib.sha256(data).hexdigest()
        missing = await _call(self.client, ApiVerb.ASSET_MISSING, {"chunks": [digest]})
        if missing["missing"]:
            body = msgpack.packb({"sha256": digest, "data": data}, use_bin_type=True)
            try:
                await self.client.call_raw(ApiVerb.ASSET_CHUNK, body, {"Content-Type": MSGPACK})
            except (ApiError, GatewayUnavailable, RequestTooLarge) as exc:
                raise raise_for(exc) from None
            del body
        return digest


async def _pieces_of_stream(request: web.Request) -> AsyncIterator[bytes]:
    while piece := await request.content.read(_PIECE):
        yield piece


async def _pieces_of_part(part: BodyPartReader) -> AsyncIterator[bytes]:
    while piece := await part.read_chunk(_PIECE):
        yield piece


async def upload_asset(request: web.Request) -> web.Response:
    """Store the files of a scene as an asset, streamed: ``multipart/form-data`` (one part per
    file, its filename the path in the asset; ``main`` names the main file, default the first)
    or a raw body (one file, at ``path``). Answers ``asset.manifest``'s reply."""
    client = _client(request)
    limits = await _call(client, ApiVerb.ASSET_MISSING, {"chunks": []})
    upload = _Upload(client, limits["chunk_bytes"], limits["max_asset_bytes"])
    main, renderer = _str(request, "main"), _str(request, "renderer")
    if request.content_type.startswith("multipart/"):
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if isinstance(part, MultipartReader):
                raise WebError(400, ErrorCode.BAD_REQUEST, "nested multipart parts are not files")
            path = part.filename or part.name
            if not path:
                raise WebError(400, ErrorCode.BAD_REQUEST, "a part has no filename (its path)")
            await upload.file(path, _pieces_of_part(part))
    else:
        path = _str(request, "path")
        if path is None:
            raise WebError(400, ErrorCode.BAD_REQUEST, "path: required for a raw upload")
        await upload.file(path, _pieces_of_stream(request))
    if not upload.files:
        raise WebError(400, ErrorCode.BAD_REQUEST, "the upload holds no file")
    try:
        manifest = Manifest.build(
            main or upload.files[0].path, upload.files, max_bytes=upload.max_bytes
        )
    except (DecodeError, ValidationError) as exc:
        raise raise_for(exc) from None
    body = {"manifest": manifest.to_json(), "renderer": renderer}
    return _json(await _call(client, ApiVerb.ASSET_MANIFEST, body))


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Param:
    """A query parameter."""

    name: str
    schema: dict[str, Any]
    doc: str
    required: bool = False


_JOB_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the job's id",
}
_LIMIT = Param("limit", {"type": "integer"}, "page size (the gateway's limits apply)")


@dataclass(frozen=True)
class Route:
    """One HTTP route: what it calls and how it is documented."""

    method: str
    path: str
    handler: Handler
    summary: str
    verb: ApiVerb | str | None = None
    query: tuple[Param, ...] = ()
    path_params: tuple[dict[str, Any], ...] = ()
    #: the request body: ``"verb"`` (the verb's request), a dataclass, or None
    body: str | type | None = None
    #: fields of the body that come from the path instead
    omit: tuple[str, ...] = ()
    #: the reply: ``"verb"`` (the verb's reply), a media type (binary), or None (SSE)
    reply: str | None = "verb"
    operator: bool = False
    #: also answers 201 (the same body) when it created something
    created: bool = False
    statuses: tuple[int, ...] = (400, 404, 429, 503)
    extra: dict[str, Any] = field(default_factory=dict)

    def _reply_schema(self, schemas: SchemaSet) -> dict[str, Any]:
        verb = ApiVerb(self.verb) if self.verb in {v.value for v in ApiVerb} else None
        if verb is not None and verb in VERB_REPLIES:
            return schemas.ref(VERB_REPLIES[verb])
        return FALLBACK_REPLIES.get(str(self.verb), {"type": "object"})

    def _body_schema(self, schemas: SchemaSet) -> dict[str, Any] | None:
        cls: type | None
        if self.body == "verb":
            verb = ApiVerb(self.verb) if self.verb is not None else None
            cls = VERB_REQUESTS.get(verb) if verb is not None else None
        else:
            cls = self.body if isinstance(self.body, type) else None
        if cls is None:
            return None
        return schemas.object(cls, omit=self.omit, strict=True)

    def operation(self, schemas: SchemaSet) -> dict[str, Any]:
        """The OpenAPI operation object."""
        error = {"$ref": "#/components/schemas/Error"}
        err = {"content": {"application/json": {"schema": error}}}
        responses: dict[str, Any] = {}
        if self.reply == "verb":
            responses["200"] = {
                "description": "the gateway's reply, without ok",
                "content": {"application/json": {"schema": self._reply_schema(schemas)}},
            }
            if self.created:
                responses["201"] = {**responses["200"], "description": "created"}
        elif self.reply is None:
            responses["200"] = {
                "description": "a server-sent-events stream",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        else:
            binary = {"type": "string", "contentMediaType": self.reply}
            responses["200"] = {
                "description": "the bytes",
                "content": {self.reply: {"schema": binary}},
            }
            responses["304"] = {"description": "unchanged since the ETag given in If-None-Match"}
        for status in (*self.statuses, 401, *((403,) if self.operator else ())):
            responses[str(status)] = {"description": _REASONS[status], **err}
        op: dict[str, Any] = {
            "summary": self.summary,
            "operationId": f"{self.method.lower()}_{self.handler.__name__}",
            "parameters": [
                *self.path_params,
                *(
                    {
                        "name": p.name,
                        "in": "query",
                        "required": p.required,
                        "schema": p.schema,
                        "description": p.doc,
                    }
                    for p in self.query
                ),
            ],
            "responses": responses,
        }
        if self.verb is not None:
            op["description"] = f"Gateway verb `{ApiVerb(self.verb).value}`. " + (
                "Needs the operator role." if self.operator else "Any role."
            )
        body = self._body_schema(schemas)
        if body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": body}},
            }
        return op | self.extra


_REASONS = {
    400: "the request is malformed or breaks a limit (bad_request, invalid)",
    401: "no token, or a wrong one",
    403: "the token's role may not do this, or the CSRF token is missing or wrong",
    404: "no such job, dead letter or project (not_found)",
    409: "the job's state does not allow it (illegal_state), or an idempotency conflict",
    413: "the body is larger than the gateway accepts",
    429: "the gateway is busy (or too many event streams): retry after Retry-After seconds",
    503: "no gateway answered (unavailable)",
}

_CHANGE = (400, 404, 409, 413, 429, 503)
_ID = (_JOB_ID,)
_STATES = {"type": "string", "enum": [s.value for s in JobState]}


def _routes() -> list[Route]:
    job_actions = [
        Route(
            "POST",
            f"/api/jobs/{{id}}/{verb.value}",
            _job_verb(verb),
            f"{verb.value} a job",
            verb,
            operator=True,
            statuses=_CHANGE,
            path_params=_ID,
        )
        for verb in (ApiVerb.CANCEL, ApiVerb.RETRY, ApiVerb.PAUSE, ApiVerb.RESUME)
    ]
    return [
        Route(
            "GET",
            "/api/jobs",
            list_jobs,
            "list jobs, newest first",
            ApiVerb.LIST,
            query=(
                Param("state", _STATES, "only jobs in this state"),
                Param(
                    "project",
                    {"type": "string"},
                    "only this project's jobs (a page may then be short, even empty: follow "
                    "next_cursor until it is null)",
                ),
                _LIMIT,
                Param("after", {"type": "string"}, "next_cursor of the page before"),
            ),
        ),
        Route(
            "POST",
            "/api/jobs",
            submit,
            "submit a frame",
            ApiVerb.SUBMIT,
            body="verb",
            operator=True,
            statuses=_CHANGE,
            created=True,
        ),
        Route(
            "GET",
            "/api/jobs/{id}",
            _job_verb(ApiVerb.STATUS),
            "a job's status",
            ApiVerb.STATUS,
            path_params=_ID,
        ),
        *job_actions,
        Route(
            "POST",
            "/api/jobs/{id}/priority",
            priority,
            "change a job's priority",
            ApiVerb.PRIORITY,
            body=rq.PriorityRequest,
            omit=("job_id",),
            operator=True,
            statuses=_CHANGE,
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/jobs/{id}/tiles",
            tiles,
            "a job's tiles (one page: follow next_offset)",
            "job.tiles",
            query=(Param("offset", {"type": "integer"}, "next_offset of the page before"),),
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/jobs/{id}/timeline",
            timeline,
            "a job's audit trail, newest first",
            "job.timeline",
            query=(
                _LIMIT,
                Param("before_id", {"type": "integer"}, "next_before_id of the page before"),
            ),
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/jobs/{id}/preview.png",
            preview,
            "the converging image (PNG)",
            "job.preview",
            reply="image/png",
            query=(Param("max_edge", {"type": "integer"}, "longest edge, pixels"),),
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/jobs/{id}/image.png",
            _image("png"),
            "the finished image (PNG)",
            ApiVerb.RESULT,
            reply="image/png",
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/jobs/{id}/image.npy",
            _image("float"),
            "the finished float image (.npy)",
            ApiVerb.RESULT,
            reply="application/x-npy",
            path_params=_ID,
        ),
        Route(
            "GET",
            "/api/dlq",
            dlq_list,
            "list dead letters, oldest first",
            ApiVerb.DLQ_LIST,
            query=(
                Param("job_id", {"type": "string"}, "only this job's"),
                _LIMIT,
                Param("cursor", {"type": "string"}, "next_cursor of the page before"),
            ),
        ),
        Route(
            "GET",
            "/api/dlq/{seq}",
            dlq_show,
            "one dead letter",
            ApiVerb.DLQ_SHOW,
            path_params=(
                {
                    "name": "seq",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "integer", "minimum": 1},
                    "description": "the letter's DLQ sequence",
                },
            ),
        ),
        Route(
            "POST",
            "/api/dlq/requeue",
            _forward(ApiVerb.DLQ_REQUEUE),
            "requeue dead letters (dry_run: only plan)",
            ApiVerb.DLQ_REQUEUE,
            body="verb",
            operator=True,
            statuses=_CHANGE,
        ),
        Route(
            "POST",
            "/api/dlq/purge",
            _forward(ApiVerb.DLQ_PURGE),
            "delete dead letters",
            ApiVerb.DLQ_PURGE,
            body="verb",
            operator=True,
            statuses=_CHANGE,
        ),
        Route(
            "GET", "/api/projects", projects, "every project", ApiVerb.PROJECT_LIST, query=(_LIMIT,)
        ),
        Route(
            "GET",
            "/api/projects/{name}",
            project_show,
            "one project",
            ApiVerb.PROJECT_SHOW,
            path_params=(_NAME,),
        ),
        Route(
            "PUT",
            "/api/projects/{name}",
            project_set,
            "set a project's weight and cap",
            ApiVerb.PROJECT_SET,
            body=rq.ProjectSetRequest,
            omit=("name",),
            operator=True,
            statuses=_CHANGE,
            path_params=(_NAME,),
        ),
        Route("GET", "/api/workers", workers, "the live workers", "workers"),
        Route(
            "GET",
            "/api/farm",
            farm,
            "the farm's operational numbers",
            "farm",
            query=(Param("window", {"type": "integer"}, "seconds looked back"),),
        ),
        Route(
            "POST",
            "/api/assets",
            upload_asset,
            "upload a scene's files as an asset",
            ApiVerb.ASSET_MANIFEST,
            operator=True,
            statuses=_CHANGE,
            query=(
                Param("path", {"type": "string"}, "a raw upload: the file's path"),
                Param("main", {"type": "string"}, "the main file (default: the first)"),
                Param("renderer", {"type": "string"}, "the renderer it is for"),
            ),
            extra={
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {
                                "type": "string",
                                "contentMediaType": "application/octet-stream",
                            }
                        },
                        "multipart/form-data": {"schema": {"type": "object"}},
                    },
                }
            },
        ),
    ]


_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "the project's name",
}

ROUTES: list[Route] = _routes()
"""Every JSON route of the API (the SSE and document routes are added by :mod:`.app`)."""


# ------------------------------------------------------------------------------ events

HUB_KEY = web.AppKey("tessera_events", EventHub)


async def events_all(request: web.Request) -> web.StreamResponse:
    """Every job's events, as server-sent events."""
    return await request.app[HUB_KEY].stream(request, None)


async def events_job(request: web.Request) -> web.StreamResponse:
    """One job's events and tile deltas, as server-sent events (404 for an unknown job)."""
    job_id = _job(request)
    await _call(_client(request), ApiVerb.STATUS, {"job_id": job_id})
    return await request.app[HUB_KEY].stream(request, job_id)


EVENT_ROUTES: list[Route] = [
    Route(
        "GET",
        "/api/events",
        events_all,
        "every job's events (server-sent events)",
        reply=None,
        statuses=(429,),
    ),
    Route(
        "GET",
        "/api/jobs/{id}/events",
        events_job,
        "one job's events and tile deltas (server-sent events)",
        ApiVerb.STATUS,
        reply=None,
        path_params=_ID,
    ),
]
"""The SSE routes (documented with the others; schemathesis leaves them out: they never end)."""
