"""The operations HTTP endpoint of a service: ``/metrics``, ``/healthz``, ``/readyz``.

One small asyncio HTTP/1.1 server per process, on ``TESSERA_METRICS_PORT`` (0 disables it),
started by :func:`shared.runtime.service_main` once the service's connections are open:

============  ===============================================================================
path          answer
============  ===============================================================================
``/metrics``  the process's registry (:class:`shared.metrics.Metrics`), Prometheus text format
``/healthz``  ``200 ok`` while the event loop runs (liveness: the process is not wedged)
``/readyz``   ``200`` if NATS is connected and PostgreSQL and the object store answer within
              :data:`CHECK_TIMEOUT` each; else ``503`` naming what failed (readiness)
============  ===============================================================================

Readiness checks run concurrently on every probe; each is one round trip (``SELECT 1``, a store
ping), bounded, so a probe never hangs on a dead dependency. It listens on every interface
(containers are probed from outside); the answers contain no secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from shared.logs import Log
from shared.metrics import CONTENT_TYPE_LATEST, Metrics

__all__ = ["CHECK_TIMEOUT", "Check", "OpsServer"]

CHECK_TIMEOUT = 2.0
_MAX_REQUEST_LINE = 8192

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when the dependency answers, raises otherwise."""


@dataclass(frozen=True)
class _Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class OpsServer:
    """Serves one process's metrics and probes; :meth:`start`, then :meth:`close`."""

    def __init__(
        self, metrics: Metrics, checks: dict[str, Check], log: Log, *, host: str = "0.0.0.0"
    ) -> None:
        self.metrics, self.checks, self.log, self.host = metrics, checks, log, host
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._server is None:
            raise RuntimeError("the ops server is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, port: int) -> OpsServer:
        """Listen on ``port`` (0: any free port)."""
        self._server = await asyncio.start_server(self._serve, self.host, port)
        self.log.info("ops endpoint listening", port=self.port, paths="/metrics,/healthz,/readyz")
        return self

    async def close(self) -> None:
        """Stop listening and close open connections."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def ready(self) -> dict[str, str]:
        """Every check's verdict: ``ok`` or the error."""
        names = list(self.checks)
        results = await asyncio.gather(
            *(_bounded(self.checks[name]) for name in names), return_exceptions=True
        )
        return {
            name: "ok" if result is None else f"{type(result).__name__}: {result}"[:300]
            for name, result in zip(names, results, strict=True)
        }

    async def answer(self, method: str, path: str) -> _Reply:
        """The reply to one request."""
        if method not in ("GET", "HEAD"):
            return _Reply(405, b"only GET\n")
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return _Reply(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            return _Reply(200, b"ok\n")
        if path == "/readyz":
            verdicts = await self.ready()
            ok = all(v == "ok" for v in verdicts.values())
            body = orjson.dumps({"ready": ok, "checks": verdicts}) + b"\n"
            return _Reply(200 if ok else 503, body, "application/json")
        return _Reply(404, b"not found: try /metrics, /healthz, /readyz\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5.0)
            parts = line[:_MAX_REQUEST_LINE].decode("latin-1").split()
            while (await asyncio.wait_for(reader.readline(), 5.0)).strip():
                pass  # headers: none matter
            reply = await self.answer(*parts[:2]) if len(parts) >= 2 else _Reply(405, b"")
            head = (
                f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}\r\n"
                f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if parts[:1] == ["HEAD"] else reply.body))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a probe that went away; nothing to answer
        except Exception:
            self.log.error("ops endpoint failed a request", exc=True)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _bounded(check: Check) -> None:
    try:
        await asyncio.wait_for(check(), CHECK_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"no answer within {CHECK_TIMEOUT:g} s") from None
