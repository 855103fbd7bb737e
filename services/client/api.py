"""Typed calls to the gateway over NATS request-reply.

Every method sends one request and returns the ok reply's fields (``ok`` removed); an error
reply raises :class:`~proto.replies.ApiError` (its ``code`` is an
:class:`~proto.replies.ErrorCode` value). When no gateway is subscribed (``no responders``,
e.g. while one restarts) the request is repeated until ``timeout`` has passed; a request that a
gateway received but did not answer within ``timeout`` is not repeated. Either way the failure is
:class:`GatewayUnavailable`. A ``busy`` reply (the gateway's intake was full; nothing was done) is
retried after its ``retry_after`` hint (with jitter, at most :data:`MAX_BUSY_PAUSE` s), again
within ``timeout``; if the gateway is still busy then, the ``busy`` error is raised.

A body larger than the API limit (:data:`proto.limits.MAX_REQUEST_BYTES`) or than the NATS
server's ``max_payload`` is refused before sending, with :class:`RequestTooLarge`.

:meth:`TesseraClient.download` needs no object-store credentials: it follows the presigned URL
``tessera.api.result`` gives for an S3 store (falling back to NATS if that URL cannot be fetched
from here) or collects the chunks over NATS, and checks the size and sha256 either way.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import random
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgpack
import nats.errors
import orjson
from nats.aio.client import Client as NATS

from proto.api import MSGPACK, ResultKind, SubmitRequest
from proto.limits import MAX_REQUEST_BYTES
from proto.names import ApiVerb, Names
from proto.replies import ApiError, ErrorCode, decode_reply
from shared.core.errors import DecodeError, StoreUnavailable, ValidationError
from shared.core.lifecycle import JobState
from shared.objectstore import CorruptObject, sha256_hex

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_BUSY_PAUSE",
    "GatewayUnavailable",
    "RequestTooLarge",
    "TesseraClient",
]

DEFAULT_TIMEOUT = 10.0
MAX_BUSY_PAUSE = 5.0
_NO_RESPONDERS_PAUSE = 0.1


class GatewayUnavailable(StoreUnavailable):
    """No gateway answered within the timeout (none running, or NATS unreachable)."""


class RequestTooLarge(ValidationError):
    """The request body is larger than the API or the NATS server accepts; it was not sent."""


def _busy_pause(exc: ApiError) -> float:
    hint = exc.retry_after if exc.retry_after is not None else _NO_RESPONDERS_PAUSE
    return min(MAX_BUSY_PAUSE, hint) * random.uniform(1.0, 1.5)  # spread the retries out


class TesseraClient:
    """The client API of one deployment (``names``) over one NATS connection."""

    def __init__(self, nc: NATS, names: Names, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.nc, self.names, self.timeout = nc, names, timeout

    async def call(self, verb: ApiVerb, body: dict[str, Any]) -> dict[str, Any]:
        """Send ``body`` (``None`` values dropped) to ``verb``; the ok reply's fields."""
        data = orjson.dumps({k: v for k, v in body.items() if v is not None})
        return await self.call_raw(verb, data)

    async def call_raw(
        self, verb: ApiVerb, data: bytes, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """:meth:`call` with a body already encoded (msgpack needs ``headers``).

        A cancel of the calling task that lands inside the NATS client's request is raised
        here, not dropped: nats-py drops a cancel that lands while a large publish is flushed
        (``except CancelledError: pass``), and its wait for the reply, :func:`asyncio.wait_for`,
        returns a reply already there and drops the cancel on Python 3.11 (CI: an interrupted
        upload's sender went on and sent every chunk).
        """
        subject = self.names.api_subject(verb)
        self._check_size(subject, data)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        task = asyncio.current_task()
        while True:
            remaining = deadline - loop.time()
            cancels = task.cancelling() if task is not None else 0
            try:
                msg = await self.nc.request(
                    subject, data, timeout=max(remaining, 0.01), headers=headers
                )
            except nats.errors.NoRespondersError:
                if remaining <= _NO_RESPONDERS_PAUSE:
                    raise GatewayUnavailable(
                        f"no gateway is serving {subject} (waited {self.timeout:g} s)"
                    ) from None
                await asyncio.sleep(_NO_RESPONDERS_PAUSE)
                continue
            except (TimeoutError, nats.errors.TimeoutError):
                raise GatewayUnavailable(
                    f"no gateway answered {subject} within {self.timeout:g} s"
                ) from None
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                raise GatewayUnavailable("the NATS connection is closed") from None
            except nats.errors.MaxPayloadError:  # headers pushed it over: same as too large
                raise self._too_large(subject, len(data), self.nc.max_payload) from None
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError  # the one the request's wait dropped
            try:
                return decode_reply(msg.data)
            except ApiError as exc:
                pause = _busy_pause(exc)
                if exc.error_code is not ErrorCode.BUSY or loop.time() + pause >= deadline:
                    raise
                await asyncio.sleep(pause)

    def _check_size(self, subject: str, data: bytes) -> None:
        limit = min(MAX_REQUEST_BYTES, self.nc.max_payload or MAX_REQUEST_BYTES)
        if len(data) > limit:
            raise self._too_large(subject, len(data), limit)

    def _too_large(self, subject: str, size: int, limit: int) -> RequestTooLarge:
        where = "the API limit" if limit == MAX_REQUEST_BYTES else "the NATS server's max_payload"
        return RequestTooLarge(
            f"{subject}: the request is {size} bytes, above {where} of {limit} bytes "
            "(make the scene smaller: fewer or coarser meshes)"
        )

    async def submit(self, request: SubmitRequest) -> dict[str, Any]:
        """Submit one frame; ``job_id``, ``created``, ``duplicate``, ``state``, keys."""
        return await self.call(ApiVerb.SUBMIT, request.to_body())

    async def status(self, job_id: str) -> dict[str, Any]:
        """State, progress, result location and last error of one job."""
        return await self.call(ApiVerb.STATUS, {"job_id": job_id})

    async def list(
        self,
        *,
        state: JobState | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """A page of jobs, newest first: ``jobs`` and ``next_cursor`` (null at the end)."""
        state_value = None if state is None else JobState(state).value
        return await self.call(
            ApiVerb.LIST, {"state": state_value, "limit": limit, "cursor": cursor}
        )

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Ask for a job to be cancelled."""
        return await self.call(ApiVerb.CANCEL, {"job_id": job_id})

    async def retry(self, job_id: str) -> dict[str, Any]:
        """Re-queue a failed or dead-lettered job as a new generation."""
        return await self.call(ApiVerb.RETRY, {"job_id": job_id})

    async def set_priority(self, job_id: str, priority: int) -> dict[str, Any]:
        """Change a queued, running, progressing or paused job's priority (0..100)."""
        return await self.call(ApiVerb.PRIORITY, {"job_id": job_id, "priority": priority})

    async def pause(self, job_id: str) -> dict[str, Any]:
        """Pause a job: its in-flight tiles checkpoint and are handed back, none released."""
        return await self.call(ApiVerb.PAUSE, {"job_id": job_id})

    async def resume(self, job_id: str) -> dict[str, Any]:
        """Resume a paused job: every tile continues from its checkpoint."""
        return await self.call(ApiVerb.RESUME, {"job_id": job_id})

    async def project_set(
        self,
        name: str,
        *,
        weight: float,
        max_in_flight: int | None = None,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Set a project's fair-share weight and in-flight cap (None: no cap), audited."""
        body = {"name": name, "weight": weight, "max_in_flight": max_in_flight, "actor": actor}
        return await self.call(ApiVerb.PROJECT_SET, body)

    async def project_list(self) -> dict[str, Any]:
        """Every project: settings, queued/in-flight tiles, core-second share."""
        return await self.call(ApiVerb.PROJECT_LIST, {})

    async def project_show(self, name: str) -> dict[str, Any]:
        """One project (``not_found`` if unknown)."""
        return await self.call(ApiVerb.PROJECT_SHOW, {"name": name})

    async def result(
        self,
        job_id: str,
        *,
        kind: ResultKind = "png",
        inline: bool = False,
        offset: int = 0,
        length: int | None = None,
    ) -> dict[str, Any]:
        """One ``tessera.api.result`` reply: a presigned ``url``, or a chunk in ``data_b64``."""
        body = {"job_id": job_id, "kind": kind, "inline": inline or None, "offset": offset or None}
        return await self.call(ApiVerb.RESULT, body | {"length": length})

    async def download(
        self,
        job_id: str,
        *,
        kind: ResultKind = "png",
        inline: bool = False,
        chunk: int | None = None,
    ) -> bytes:
        """A completed job's image, whole and verified (size and sha256).

        ``inline`` takes the bytes over NATS even where the store signs URLs; ``chunk`` asks
        for smaller chunks than the gateway's. :class:`CorruptObject` if the bytes differ.
        """
        first = await self.result(job_id, kind=kind, inline=inline, length=chunk)
        if first["url"] is not None:
            try:
                return _verified(first, await fetch_url(first["url"], self.timeout))
            except StoreUnavailable:  # the store is not reachable from here: ask the gateway
                first = await self.result(job_id, kind=kind, inline=True, length=chunk)
        parts, reply = [], first
        while True:
            data = base64.b64decode(reply["data_b64"])
            if len(data) != reply["length"] or reply["sha256"] != first["sha256"]:
                raise DecodeError(f"result of {job_id}: a chunk does not match its reply")
            parts.append(data)
            following = reply["next_offset"]
            if following is None:
                return _verified(first, b"".join(parts))
            if following <= reply["offset"]:
                raise DecodeError(f"result of {job_id}: next_offset {following} goes backwards")
            reply = await self.result(
                job_id, kind=kind, inline=True, offset=following, length=chunk
            )

    async def asset_missing(self, chunks: Sequence[str]) -> dict[str, Any]:
        """Which of ``chunks`` (at most 128 digests) the store lacks, and the asset limits."""
        return await self.call(ApiVerb.ASSET_MISSING, {"chunks": list(chunks)})

    async def asset_chunk(self, sha256: str, data: bytes) -> dict[str, Any]:
        """Store one chunk (at most 4 MiB) under its sha256 (msgpack: ``data`` is binary)."""
        body = msgpack.packb({"sha256": sha256, "data": data}, use_bin_type=True)
        return await self.call_raw(ApiVerb.ASSET_CHUNK, body, {"Content-Type": MSGPACK})

    async def asset_manifest(
        self, manifest: dict[str, Any], renderer: str | None = None
    ) -> dict[str, Any]:
        """Store an asset's manifest (every chunk stored first); its reference is ``asset``."""
        return await self.call(ApiVerb.ASSET_MANIFEST, {"manifest": manifest, "renderer": renderer})

    async def dlq_list(
        self, *, job_id: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> dict[str, Any]:
        """A page of dead letters, oldest first: ``dead_letters`` and ``next_cursor``."""
        body = {"job_id": job_id, "limit": limit, "cursor": cursor}
        return await self.call(ApiVerb.DLQ_LIST, body)

    async def dlq_show(self, seq: int) -> dict[str, Any]:
        """One dead letter by its DLQ stream sequence, with the original payload."""
        return await self.call(ApiVerb.DLQ_SHOW, {"seq": seq})

    async def dlq_requeue(
        self,
        *,
        job_id: str | None = None,
        dry_run: bool = False,
        rate: int | None = None,
        limit: int | None = None,
        seqs: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """Requeue dead letters (one job's, or all, or the ``seqs`` named) at ``rate`` per
        second; ``dry_run`` plans.

        The gateway replies when every requeue is done: allow ``count / rate`` seconds.
        """
        body = {"job_id": job_id, "dry_run": dry_run, "rate": rate, "limit": limit,
                "seqs": None if seqs is None else list(seqs)}  # fmt: skip
        return await self.call(ApiVerb.DLQ_REQUEUE, body)

    async def dlq_purge(
        self, *, job_id: str | None = None, everything: bool = False, dry_run: bool = False
    ) -> dict[str, Any]:
        """Delete one job's dead letters (or all of them); ``dry_run`` only counts."""
        body = {"job_id": job_id, "all": everything or None, "dry_run": dry_run}
        return await self.call(ApiVerb.DLQ_PURGE, body)

    async def job_tiles(self, job_id: str, *, offset: int | None = None) -> dict[str, Any]:
        """A job's tiles: rows of ``columns`` (``tiles``), ``next_offset`` if more remain."""
        return await self.call(ApiVerb.JOB_TILES, {"job_id": job_id, "offset": offset})

    async def all_tiles(self, job_id: str) -> builtins.list[dict[str, Any]]:
        """Every tile of a job as a ``{column: value}`` dict, in index order (pages followed)."""
        out: builtins.list[dict[str, Any]] = []
        offset: int | None = None
        while True:
            reply = await self.job_tiles(job_id, offset=offset)
            out += [dict(zip(reply["columns"], row, strict=True)) for row in reply["tiles"]]
            offset = reply["next_offset"]
            if offset is None:
                return out

    async def job_timeline(
        self, job_id: str, *, limit: int | None = None, before_id: int | None = None
    ) -> dict[str, Any]:
        """A page of the job's audit trail, newest first: ``events``, ``next_before_id``."""
        body = {"job_id": job_id, "limit": limit, "before_id": before_id}
        return await self.call(ApiVerb.JOB_TIMELINE, body)

    async def job_preview(self, job_id: str, *, max_edge: int | None = None) -> dict[str, Any]:
        """The image so far: a PNG (``data_b64``) fitting ``max_edge``, and its ``version``."""
        return await self.call(ApiVerb.JOB_PREVIEW, {"job_id": job_id, "max_edge": max_edge})

    async def workers(self, *, renderer: str | None = None) -> dict[str, Any]:
        """The live workers (node, threads, renderers, tiles in hand), by node."""
        return await self.call(ApiVerb.WORKERS, {"renderer": renderer})

    async def farm(self, *, window: int | None = None) -> dict[str, Any]:
        """The farm's operational numbers over the last ``window`` seconds (default 300)."""
        return await self.call(ApiVerb.FARM, {"window": window})


def _verified(reply: dict[str, Any], data: bytes) -> bytes:
    if len(data) != reply["size"] or sha256_hex(data) != reply["sha256"]:
        raise CorruptObject(
            f"result of {reply['job_id']}: got {len(data)} bytes with sha256 {sha256_hex(data)}, "
            f"expected {reply['size']} bytes with sha256 {reply['sha256']}"
        )
    return data


async def fetch_url(url: str, stall: float) -> bytes:
    """The body of an HTTP GET (a presigned result URL); :class:`StoreUnavailable` on failure.

    ``stall`` (seconds) bounds connecting and each read, not the whole (large) download.
    """
    limits = aiohttp.ClientTimeout(total=None, connect=stall, sock_read=stall)
    try:
        async with (
            aiohttp.ClientSession(timeout=limits) as http,
            http.get(url, allow_redirects=False) as response,
        ):
            response.raise_for_status()
            return await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        # not str(exc): it would repeat the URL, signature and all
        status = getattr(exc, "status", None)
        raise StoreUnavailable(f"result URL: {type(exc).__name__} {status or ''}".strip()) from exc
