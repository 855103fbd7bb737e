"""Server-sent events: ``/api/events`` (every job) and ``/api/jobs/{id}/events`` (one job).

Each event published on core NATS ``tessera.events.<job>.<kind>`` (msgpack, see ``docs/api.md``)
is decoded once and sent to every client watching it as::

    id: <n>
    event: <kind>              (tile-done, job-completed, job-paused, ...)
    data: <the TileDone, TilesDone or JobEvent as JSON>

One NATS subscription serves every client of a stream: ``tessera.events.>`` while any client of
``/api/events`` is connected, ``tessera.events.<job>.>`` while any client of that job's stream is;
the last client to leave unsubscribes. A job's stream also carries ``event: tiles``: the tiles
that changed since the previous one (``full: true`` and every tile the first time a client
connects), from the gateway's ``job.tiles`` polled at most every :data:`TILES_INTERVAL` seconds,
by one poller per job, only while the job has clients. A gateway that lacks ``job.tiles`` (or is
down) only means no ``tiles`` events; the job events still flow.

Bounded: each client has a queue of ``TESSERA_WEB_SSE_QUEUE`` events; a client that falls that
far behind (a stalled browser tab) is disconnected rather than buffered for (it reconnects: the
``retry:`` hint is 2 s, and reloads). At most ``TESSERA_WEB_SSE_CLIENTS`` streams are open at once
(more: 429 ``busy``). A comment line is sent every ``TESSERA_WEB_HEARTBEAT`` seconds so proxies
keep the connection and a client that went away is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from typing import Any

import orjson
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from proto.messages import JobEvent, TileDone, TilesDone
from proto.names import ApiVerb, EventKind, Names
from proto.replies import ApiError
from services.client.api import TesseraClient
from services.web.errors import WebError
from shared.core.config import WebSettings
from shared.core.errors import TesseraError
from shared.service.logs import Log

__all__ = ["TILES_INTERVAL", "EventHub", "decode_event"]

TILES_INTERVAL = 0.25
"""The least time between two ``job.tiles`` polls of one job (seconds)."""
_TILES_BACKOFF = 2.0
"""Seconds a poller waits after ``job.tiles`` failed (absent verb, gateway down)."""
_TILES_TIMEOUT = 2.0
_CLOSE = object()


def decode_event(subject: str, data: bytes) -> tuple[str, dict[str, Any]] | None:
    """``(kind, fields)`` of an EVENTS message, or None if it is not a Tessera event."""
    kind = subject.rsplit(".", 1)[-1]
    try:
        if kind == EventKind.TILE_DONE.value:
            return kind, dataclasses.asdict(TileDone.decode(data))
        if kind == EventKind.TILES_DONE.value:
            return kind, dataclasses.asdict(TilesDone.decode(data))
        if kind in {k.value for k in EventKind}:
            fields = dataclasses.asdict(JobEvent.decode(data))
            fields["kind"] = EventKind(fields["kind"]).value
            return kind, fields
    except TesseraError:
        return None
    return None


class _Client:
    """One open stream: a bounded queue of frames."""

    def __init__(self, request: web.Request, size: int) -> None:
        self.request = request
        self.queue: asyncio.Queue[bytes | object] = asyncio.Queue(size)
        self.dropped = False

    def offer(self, frame: bytes) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.drop()

    def drop(self) -> None:
        """Too far behind: disconnect it (its writer may be stuck on a full socket)."""
        self.dropped = True
        transport = self.request.transport
        if transport is not None:
            transport.close()
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_CLOSE)

    def close(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_CLOSE)
        if self.queue.full():
            self.drop()


def _frame(kind: str, payload: dict[str, Any], seq: int) -> bytes:
    data = orjson.dumps(payload)
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, kind.encode(), data)


class _Topic:
    """Clients of one subject, its subscription, and (for a job) its tiles poller."""

    def __init__(self, subject: str, job_id: str | None) -> None:
        self.subject, self.job_id = subject, job_id
        self.clients: set[_Client] = set()
        self.sub: Subscription | None = None
        self.poller: asyncio.Task[None] | None = None
        self.tiles: dict[int, dict[str, Any]] = {}
        self.head: dict[str, Any] = {}
        self.polled = False


class EventHub:
    """Every open stream of one web process."""

    def __init__(self, nc: NATS, client: TesseraClient, settings: WebSettings, log: Log) -> None:
        self.nc, self.settings, self.log = nc, settings, log
        self.names: Names = client.names
        self.poll_client = TesseraClient(nc, client.names, timeout=_TILES_TIMEOUT)
        self.topics: dict[str, _Topic] = {}
        self.open = 0
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()
        self._closing = False

    def _events_subject(self, job_id: str | None) -> str:
        if job_id is None:
            return self.names.events_subjects
        one = self.names.event_subject(job_id, EventKind.JOB_COMPLETED)
        return one.rsplit(".", 1)[0] + ".>"

    async def stream(self, request: web.Request, job_id: str | None) -> web.StreamResponse:
        """Serve one SSE client until it leaves, falls behind, or the service stops."""
        if self.open >= self.settings.sse_clients:
            raise _busy()
        self.open += 1
        client = _Client(request, self.settings.sse_queue)
        try:
            topic = await self._join(client, job_id)
            try:
                return await self._serve(request, client)
            finally:
                await self._leave(client, topic)
        finally:
            self.open -= 1

    async def _join(self, client: _Client, job_id: str | None) -> _Topic:
        subject = self._events_subject(job_id)
        async with self._lock:
            topic = self.topics.get(subject)
            if topic is None:
                topic = self.topics[subject] = _Topic(subject, job_id)

                async def on_msg(msg: Msg, topic: _Topic = topic) -> None:
                    self._publish(topic, msg)

                topic.sub = await self.nc.subscribe(subject, cb=on_msg)
                await self.nc.flush(timeout=5)  # subscribed before the client hears "ready"
                if job_id is not None:
                    topic.poller = asyncio.create_task(self._poll_tiles(topic))
            elif topic.job_id is not None and topic.polled:
                tiles = [topic.tiles[i] for i in sorted(topic.tiles)]
                client.offer(self._tiles_frame(topic, tiles, full=True))
            topic.clients.add(client)
        return topic

    async def _leave(self, client: _Client, topic: _Topic) -> None:
        async with self._lock:
            topic.clients.discard(client)
            if topic.clients or self.topics.get(topic.subject) is not topic:
                return
            del self.topics[topic.subject]
            if topic.poller is not None:
                topic.poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await topic.poller
            if topic.sub is not None:
                with contextlib.suppress(Exception):  # the connection may be closing
                    await topic.sub.unsubscribe()

    async def _serve(self, request: web.Request, client: _Client) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
            }
        )
        await response.prepare(request)
        try:
            await response.write(b"retry: 2000\n: ready\n\n")
            while not client.dropped and not self._closing:
                try:
                    item = await asyncio.wait_for(client.queue.get(), self.settings.heartbeat)
                except TimeoutError:
                    await response.write(b": heartbeat\n\n")
                    continue
                if item is _CLOSE or not isinstance(item, bytes):
                    break
                await response.write(item)
        except (ConnectionResetError, ConnectionError, RuntimeError):
            pass  # the client went away (or was dropped): nothing to answer
        return response

    def _publish(self, topic: _Topic, msg: Msg) -> None:
        decoded = decode_event(msg.subject, msg.data)
        if decoded is None:
            return
        frame = _frame(decoded[0], decoded[1], next(self._seq))
        for client in list(topic.clients):
            client.offer(frame)

    def _tiles_frame(self, topic: _Topic, tiles: list[dict[str, Any]], *, full: bool) -> bytes:
        payload = {**topic.head, "full": full, "tiles": tiles}
        return _frame("tiles", payload, next(self._seq))

    async def _poll_tiles(self, topic: _Topic) -> None:
        assert topic.job_id is not None
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                reply = await self.poll_client.call(ApiVerb("job.tiles"), {"job_id": topic.job_id})
            except (ApiError, TesseraError, ValueError) as exc:
                self.log.debug("job.tiles poll failed", job_id=topic.job_id, error=str(exc))
                await asyncio.sleep(_TILES_BACKOFF)
                continue
            self._tiles_changed(topic, reply)
            await asyncio.sleep(max(0.0, TILES_INTERVAL - (loop.time() - started)))

    def _tiles_changed(self, topic: _Topic, reply: dict[str, Any]) -> None:
        entries = reply.get("tiles") or []
        first, topic.polled = not topic.polled, True
        topic.head = {k: v for k, v in reply.items() if k != "tiles"}
        changed = []
        for entry in entries:
            index = entry.get("index")
            if isinstance(index, int) and topic.tiles.get(index) != entry:
                topic.tiles[index] = entry
                changed.append(entry)
        if changed or first:
            frame = self._tiles_frame(topic, changed, full=first)
            for client in list(topic.clients):
                client.offer(frame)

    async def close(self) -> None:
        """End every stream (the service is stopping) and unsubscribe."""
        self._closing = True
        for topic in list(self.topics.values()):
            for client in list(topic.clients):
                client.close()
            if topic.poller is not None:
                topic.poller.cancel()


def _busy() -> WebError:
    return WebError(429, "busy", "too many event streams are open; try again", retry_after=5)
