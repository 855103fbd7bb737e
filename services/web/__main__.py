"""``tessera web`` / ``python -m services.web``: the web console and HTTP API until SIGTERM.

Unlike the other services it opens no PostgreSQL and no object store (``TESSERA_DATABASE_URL``
and ``TESSERA_OBJECT_STORE`` are not needed): only NATS, to call the gateway and hear events.
Exit status: 0 stopped; 1 could not start (NATS unreachable, the port taken) or crashed; 2
configuration error (a bad variable, tokens missing on a non-loopback host).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import uvloop
from aiohttp import web
from nats.aio.client import Client as NATS

from proto.names import Names
from services.client.api import TesseraClient
from services.web.app import GENERATED_TOKEN_KEY, build_app, settings_from_env
from shared.core import crash
from shared.core.config import Settings
from shared.core.errors import ConfigError, StoreUnavailable, TesseraError
from shared.nats.jetstream import connect_nats
from shared.service.logs import Log, setup_logging
from shared.service.memory import reuse_freed_memory
from shared.service.metrics import Metrics
from shared.service.observability import Check, OpsServer

_SHUTDOWN_TIMEOUT = 5.0


def main() -> int:
    """Run the web service until SIGTERM/SIGINT; returns the exit status."""
    try:
        settings = settings_from_env(os.environ)
        crash.arm(os.environ)
    except ConfigError as exc:
        print(f"tessera web: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.process.log_level)
    reuse_freed_memory(settings.process.malloc_reuse_bytes)  # (its previews and pages)
    return uvloop.run(run(settings))


async def run(settings: Settings) -> int:
    """Connect, serve, and stop cleanly when signalled."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log = Log("tessera.web", service="web", node=settings.node)
    try:
        nc = await connect_nats(settings, name=f"web:{settings.node}")
    except TesseraError as exc:
        log.error("start-up failed", error=str(exc), code=exc.code)
        return 1
    client = TesseraClient(nc, Names(settings.deployment.namespace), timeout=settings.web.timeout)
    runner: web.AppRunner | None = None
    ops: OpsServer | None = None
    try:
        try:
            app = build_app(settings, client, nc)
        except ConfigError as exc:
            log.error("start-up failed", error=str(exc), code=exc.code)
            return 2
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.web.host, settings.web.port).start()
        except OSError as exc:
            log.error(
                "start-up failed",
                error=f"cannot listen on {settings.web.host}:"
                f"{settings.web.port}: {exc.strerror or exc}",
            )
            return 1
        if settings.process.metrics_port > 0:
            ops = OpsServer(Metrics(), _checks(nc), log, host=settings.process.metrics_host)
            await ops.start(settings.process.metrics_port)
        made = app[GENERATED_TOKEN_KEY]
        if made:  # loopback only (services.web.auth.tokens_for)
            log.warning("TESSERA_WEB_TOKEN is empty: made up an operator token", token=made)
        url = f"http://{settings.web.host}:{settings.web.port}/"
        log.info("started", namespace=settings.deployment.namespace, url=url)
        await stop.wait()
    except Exception:
        log.error("service crashed", exc=True)
        return 1
    finally:
        if ops is not None:
            await ops.close()
        if runner is not None:
            await runner.cleanup()
        if not nc.is_closed:
            await nc.drain()
    log.info("stopped")
    return 0


def _checks(nc: NATS) -> dict[str, Check]:
    """``/readyz`` of the web service: NATS connected (the gateway is asked per request)."""

    async def nats() -> None:
        if not nc.is_connected:
            raise StoreUnavailable("NATS is not connected")
        await nc.flush(timeout=1)

    return {"nats": nats}


if __name__ == "__main__":
    sys.exit(main())
