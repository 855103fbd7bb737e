"""What every service process shares: settings, connections, and a clean life cycle.

:func:`service_main` is the whole ``__main__`` of a service: it builds the settings from the
environment (a bad value exits with status 2 and a message naming the variable), arms the crash
point, configures logs, runs the service's coroutine on uvloop with a ``stop`` event that SIGTERM
and SIGINT set, and closes every connection on the way out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import uvloop
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from proto import names as n
from proto.topology import Topology
from shared.core import crash
from shared.core.config import Settings
from shared.core.errors import ConfigError, StoreUnavailable, TesseraError
from shared.core.retry import RetryPolicy
from shared.metadata import MetadataStore
from shared.nats.ensure import ensure_topology
from shared.nats.jetstream import connect_nats
from shared.nats.leases import Leases, ProgressPointers
from shared.objectstore import ObjectStore, open_object_store
from shared.service.logs import Log, setup_logging
from shared.service.memory import reuse_freed_memory
from shared.service.metrics import Metrics
from shared.service.observability import Check, OpsServer

__all__ = ["Runtime", "service_main", "topology_for"]


def topology_for(settings: Settings) -> Topology:
    """The JetStream topology these settings describe."""
    deployment, delivery = settings.deployment, settings.delivery
    return Topology(
        prefix=deployment.namespace,
        replicas=deployment.replicas,
        duplicate_window=float(deployment.duplicate_window),
        ack_wait=float(delivery.ack_wait),
        max_deliver=delivery.max_deliver,
    )


@dataclass
class Runtime:
    """Open connections of one service process."""

    settings: Settings
    service: str
    log: Log
    nc: NATS
    js: JetStreamContext
    topology: Topology
    db: MetadataStore
    store: ObjectStore
    leases: Leases
    progress: ProgressPointers
    retry: RetryPolicy
    #: this process's Prometheus registry (served on ``TESSERA_METRICS_PORT``)
    metrics: Metrics = field(default_factory=Metrics)

    @property
    def names(self) -> n.Names:
        """Subject, stream and bucket names of this deployment."""
        return self.topology.names

    @property
    def node(self) -> str:
        """This process's name in leases, attempts and logs."""
        return self.settings.node

    @classmethod
    async def open(cls, settings: Settings, service: str) -> Runtime:
        """Connect to NATS, PostgreSQL and the object store; declare the topology."""
        log = Log(f"tessera.{service}", service=service, node=settings.node)
        topology = topology_for(settings)
        nc = await connect_nats(settings, name=f"{service}:{settings.node}")
        try:
            js = nc.jetstream(timeout=10)
            await ensure_topology(js, topology)
            # (the worker's statements are keyed: planned once per connection, StoreBase.connect)
            db = await MetadataStore.connect(
                settings.database_url, generic_plans=service == "worker"
            )
        except BaseException:
            await nc.close()
            raise
        try:
            store = await open_object_store(settings.object_store)
        except BaseException:
            await db.close()
            await nc.close()
            raise
        names = topology.names
        return cls(
            settings=settings,
            service=service,
            log=log,
            nc=nc,
            js=js,
            topology=topology,
            db=db,
            store=store,
            leases=Leases(js, names.bucket(n.BUCKET_LEASES), settings.leases.ttl),
            progress=ProgressPointers(js, names.bucket(n.BUCKET_PROGRESS)),
            retry=settings.delivery.retry_policy(),
        )

    def readiness_checks(self) -> dict[str, Check]:
        """What ``/readyz`` asks: NATS connected, PostgreSQL and the object store answering."""

        async def nats() -> None:
            if not self.nc.is_connected:
                raise StoreUnavailable("NATS is not connected")
            await self.nc.flush(timeout=1)

        return {"nats": nats, "postgres": self.db.ping, "object_store": self.store.ping}

    async def close(self) -> None:
        """Close every connection; errors while closing are logged, not raised."""
        for name, closer in (("store", self.store.close), ("db", self.db.close)):
            try:
                await closer()
            except Exception:
                self.log.error(f"closing {name} failed", exc=True)
        if not self.nc.is_closed:
            await self.nc.drain()


ServiceBody = Callable[[Runtime, asyncio.Event], Awaitable[None]]


def service_main(service: str, body: ServiceBody) -> int:
    """Run one service until SIGTERM/SIGINT; returns the process exit status."""
    try:
        settings = Settings.from_env(os.environ)
        crash.arm(os.environ)
    except ConfigError as exc:
        print(f"tessera {service}: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.process.log_level)
    return uvloop.run(_run(settings, service, body))


async def _run(settings: Settings, service: str, body: ServiceBody) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log = Log(f"tessera.{service}", service=service, node=settings.node)
    reuse = reuse_freed_memory(settings.process.malloc_reuse_bytes)
    try:
        runtime = await Runtime.open(settings, service)
    except TesseraError as exc:
        log.error("start-up failed", error=str(exc), code=exc.code)
        # a setting the servers refuse (a topology that differs from the one declared) is a
        # configuration error like a malformed variable; anything else is a failed start
        return 2 if isinstance(exc, ConfigError) else 1
    log.info("started", namespace=settings.deployment.namespace,
             malloc_reuse_bytes=settings.process.malloc_reuse_bytes if reuse else 0)  # fmt: skip
    ops: OpsServer | None = None
    try:
        if settings.process.metrics_port > 0:
            ops = OpsServer(
                runtime.metrics, runtime.readiness_checks(), log, host=settings.process.metrics_host
            )
            await ops.start(settings.process.metrics_port)
        await body(runtime, stop)
    except Exception:
        log.error("service crashed", exc=True)
        return 1
    finally:
        if ops is not None:
            await ops.close()
        await runtime.close()
    log.info("stopped")
    return 0
