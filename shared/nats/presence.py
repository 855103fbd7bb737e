"""The live-workers bucket (``tessera-workers``): who is rendering, with how many threads.

Each worker puts ``worker.<node>`` every :data:`REFRESH` seconds with a per-key TTL of
:data:`TTL` seconds (the server's clock expires a worker that stopped refreshing: crashed,
partitioned) and deletes it on a clean stop. The dispatcher sums the threads per renderer for
its release window; ``tessera top`` lists the workers. Reads are leader reads of the bucket's
stream (one subject listing, then one read per listed key), as for leases.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
from nats.js import JetStreamContext

from proto import names as n
from shared.core.errors import DecodeError, RetryableError, TerminalError
from shared.nats.jetstream import subjects_with_messages
from shared.nats.leases import _Bucket

__all__ = ["REFRESH", "TTL", "LiveRenderers", "LiveWorkers", "WorkerInfo", "capacity", "spare"]

TTL = 10
"""Seconds a worker's key lives without a refresh."""
REFRESH = 2.0
"""Seconds between a worker's refreshes (a few refreshes fit in :data:`TTL`)."""
_OP_TIMEOUT = 10.0
_READS = 32


@dataclass(frozen=True)
class WorkerInfo:
    """One live worker as it announces itself."""

    node: str
    threads: int
    in_hand: int
    #: renderer name -> version
    renderers: dict[str, str]
    version: str
    started_at: float
    #: ``[job_id, tile_index]`` of the tiles in hand
    current: list[list[Any]] = field(default_factory=list)
    #: sends :class:`~proto.messages.Room` messages (a worker from before them: ``False``, and
    #: the dispatchers count its tile-done events instead)
    room: bool = False

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> WorkerInfo:
        try:
            data = orjson.loads(raw)
            return cls(
                node=str(data["node"]),
                threads=int(data["threads"]),
                in_hand=int(data["in_hand"]),
                renderers={str(k): str(v) for k, v in dict(data["renderers"]).items()},
                version=str(data["version"]),
                started_at=float(data["started_at"]),
                current=[list(c) for c in data.get("current", [])],
                room=data.get("room", False) is True,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DecodeError(f"live-worker value is not a WorkerInfo: {exc}") from exc


class LiveWorkers:
    """The workers bucket of one deployment."""

    def __init__(self, js: JetStreamContext, bucket: str, *, ttl: int = TTL) -> None:
        self._kv = _Bucket(js, bucket, _OP_TIMEOUT)
        self.ttl = ttl

    async def put(self, info: WorkerInfo) -> None:
        """Announce (or refresh) ``info``, expiring after :attr:`ttl` s without a refresh."""
        await self._kv.write(n.worker_key(info.node), info.encode(), last=None, ttl=self.ttl)

    async def remove(self, node: str) -> None:
        """A clean stop: the key's delete marker (itself expiring after the TTL)."""
        await self._kv.write(n.worker_key(node), b"", last=None, ttl=self.ttl, delete=True)

    async def list(self) -> list[WorkerInfo]:
        """The live workers, by node (an unreadable value is skipped)."""
        listed = await subjects_with_messages(
            self._kv.js,
            self._kv.stream,
            self._kv.filter_subject(n.WORKER_KEYS),
            timeout_total=_OP_TIMEOUT,
        )
        prefix = f"$KV.{self._kv.name}."
        keys = sorted(s.removeprefix(prefix) for s in (listed or {}))
        gate = asyncio.Semaphore(_READS)

        async def one(key: str) -> WorkerInfo | None:
            async with gate:
                raw = await self._kv.read(key)
            if raw is None or raw.deleted:
                return None
            try:
                return WorkerInfo.decode(raw.value)
            except DecodeError:
                return None

        found = await asyncio.gather(*(one(k) for k in keys))
        return sorted((w for w in found if w is not None), key=lambda w: w.node)


class LiveRenderers:
    """Which renderers the live workers run, read from the bucket at most every ``ttl`` seconds
    (``tessera status`` asks on every call: a cached answer keeps it one SQL read)."""

    def __init__(self, workers: LiveWorkers, ttl: float = 2.0) -> None:
        self.workers, self.ttl = workers, ttl
        self._at = -float("inf")
        self._running: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()

    async def running(self) -> frozenset[str]:
        """Names of the renderers at least one live worker announces."""
        async with self._lock:
            now = time.monotonic()
            if now - self._at >= self.ttl:
                live = await self.workers.list()
                self._running = frozenset(r for w in live for r in w.renderers)
                self._at = now
            return self._running

    async def waiting(self, renderer: str) -> str | None:
        """Why a job of ``renderer`` waits, if no live worker runs it; ``None`` otherwise (also
        when the bucket cannot be read: the status must not fail for it)."""
        try:
            running = await self.running()
        except (RetryableError, TerminalError):
            return None
        if renderer in running:
            return None
        if not running:
            return "no live worker: its tiles wait until one announces itself"
        return (
            f"no live worker runs the {renderer!r} renderer (live workers run: "
            f"{', '.join(sorted(running))}); its tiles wait until one does"
        )


def capacity(workers: list[WorkerInfo], factor: float) -> dict[str, int]:
    """``renderer -> factor x threads`` summed over the workers announcing it."""
    out: dict[str, int] = {}
    for w in workers:
        for renderer in w.renderers:
            out[renderer] = out.get(renderer, 0) + w.threads
    return {r: int(factor * t) for r, t in out.items()}


def spare(workers: list[WorkerInfo], factor: float) -> dict[str, int]:
    """``renderer -> `` the fewest tiles any worker announcing it holds beyond one per kernel
    thread: ``min(in_hand, factor x threads) - threads`` (a worker holds at most what it asks
    for, and the window releases ``factor x threads`` for it), at least 0. So many tiles can
    finish, all at one worker, before any of its threads waits for a release."""
    out: dict[str, int] = {}
    for w in workers:
        room = max(0, min(w.in_hand, int(factor * w.threads)) - w.threads)
        for renderer in w.renderers:
            out[renderer] = min(out.get(renderer, room), room)
    return out
