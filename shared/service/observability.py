"""The operations HTTP endpoint of a service: ``/metrics``, ``/healthz``, ``/readyz``.

One small HTTP server per process, on ``TESSERA_METRICS_PORT`` (0 disables it),
started by :func:`shared.service.runtime.service_main` once the service's connections are open:

============  ===============================================================================
path          answer
============  ===============================================================================
``/metrics``  the process's registry (:class:`shared.service.metrics.Metrics`), Prometheus text
format ``/healthz``  ``200 ok`` while the event loop runs (liveness: the process is not wedged)
``/readyz``   ``200`` if NATS is connected and PostgreSQL and the object store answer within
              :data:`CHECK_TIMEOUT` each; else ``503`` naming what failed (readiness)
============  ===============================================================================

Readiness checks run concurrently on every probe; each is one round trip (``SELECT 1``, a store
ping), bounded, so a probe never hangs on a dead dependency. The HTTP side is aiohttp's server
(``GET`` and ``HEAD`` on each path, ``405``/``404`` otherwise, no access log). It listens on
``TESSERA_METRICS_HOST``, every interface by default (containers are probed from outside); the
answers contain no secrets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from shared.service.logs import Log
from shared.service.metrics import CONTENT_TYPE_LATEST, Metrics

__all__ = ["CHECK_TIMEOUT", "Check", "OpsServer"]

CHECK_TIMEOUT = 2.0
#: seconds :meth:`OpsServer.close` waits for requests in progress
_SHUTDOWN_TIMEOUT = 2.0
#: seconds an idle connection (a scraper between scrapes, a silent port scan) is kept open
_KEEPALIVE = 5.0

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when the dependency answers, raises otherwise."""


class OpsServer:
    """Serves one process's metrics and probes; :meth:`start`, then :meth:`close`."""

    def __init__(
        self, metrics: Metrics, checks: dict[str, Check], log: Log, *, host: str = "0.0.0.0"
    ) -> None:
        self.metrics, self.checks, self.log, self.host = metrics, checks, log, host
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("the ops server is not started")
        port: int = self._runner.addresses[0][1]
        return port

    async def start(self, port: int) -> OpsServer:
        """Listen on ``port`` (0: any free port)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)  # add_get answers HEAD as well
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
            keepalive_timeout=_KEEPALIVE,  # aiohttp's default keeps idle sockets for an hour
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.log.info(
            "ops endpoint listening", host=self.host, port=self.port,
            paths="/metrics,/healthz,/readyz",
        )  # fmt: skip
        return self

    async def close(self) -> None:
        """Stop listening; requests in progress get a short grace."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

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

    async def _metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        verdicts = await self.ready()
        ok = all(v == "ok" for v in verdicts.values())
        body = orjson.dumps({"ready": ok, "checks": verdicts}) + b"\n"
        return web.Response(status=200 if ok else 503, body=body, content_type="application/json")


async def _bounded(check: Check) -> None:
    try:
        await asyncio.wait_for(check(), CHECK_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"no answer within {CHECK_TIMEOUT:g} s") from None
