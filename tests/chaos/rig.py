"""The chaos harness: the four services as OS processes, a supervisor, and views of every store.

A :class:`Rig` owns one set of :class:`~tests.harness.ServiceProcesses` plus the test's own
connections to NATS, PostgreSQL and the object store. Its :class:`Supervisor` does what a process
supervisor (systemd, Kubernetes) would: it polls ``alive()`` and restarts whatever died —
without the crash environment, unless a scenario makes a crash *sticky* (a poison tile that
kills every worker that touches it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import orjson
from nats.aio.client import Client as NATS

from proto import names as n
from proto.api import SubmitRequest
from proto.replies import ApiError, ErrorCode
from services.client.api import GatewayUnavailable, TesseraClient
from shared.core.config import Settings
from shared.core.errors import RetryableError
from shared.metadata import MetadataStore
from shared.objectstore import ObjectStore, open_object_store
from tests.e2e.flows import TERMINAL
from tests.harness import ServiceProcesses
from tests.helpers import eventually

CRASH_LINE = "tessera: crash point "
#: transient failures a test's own calls ride out while servers restart
TRANSIENT: tuple[type[BaseException], ...] = (
    GatewayUnavailable,
    RetryableError,
    nats.errors.Error,
    TimeoutError,
    OSError,
)


def tiny(**overrides: Any) -> dict[str, Any]:
    """A tiny cornell request: 32x32, 16 px tiles (4 tiles), 16 spp."""
    body: dict[str, Any] = {
        "project": "chaos",
        "scene": "cornell",
        "width": 32,
        "height": 32,
        "spp": 16,
        "tile_size": 16,
    }
    return body | overrides


@dataclass
class Supervisor:
    """Restarts dead service processes, within a bound, like a real supervisor would."""

    procs: ServiceProcesses
    #: name -> environment a restart of that process gets (a sticky crash); default: none
    sticky: dict[str, dict[str, str]] = field(default_factory=dict)
    max_restarts: int = 40
    interval: float = 0.1
    restarts: Counter[str] = field(default_factory=Counter)
    exit_codes: list[tuple[str, int | None]] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # names a scenario keeps down on purpose
    #: name -> environment for that process's next restart only (then sticky/none again)
    once: dict[str, dict[str, str]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.interval)

    def poll(self) -> None:
        """Restart every process that died (once per death)."""
        for name, proc in list(self.procs.procs.items()):
            if name in self.held or proc.alive():
                continue
            if sum(self.restarts.values()) >= self.max_restarts:
                raise AssertionError(f"more than {self.max_restarts} restarts: a crash loop")
            self.exit_codes.append((name, proc.wait(0)))
            self.restarts[name] += 1
            self.procs.restart(name, env=self.once.pop(name, None) or self.sticky.get(name))

    @property
    def sigkills(self) -> int:
        return sum(1 for _, code in self.exit_codes if code == -9)


@dataclass
class Rig:
    """Service processes of one scenario plus the test's own view of every store."""

    procs: ServiceProcesses
    supervisor: Supervisor
    settings: Settings
    nc: NATS
    client: TesseraClient
    db: MetadataStore
    objects: ObjectStore

    @property
    def names(self) -> n.Names:
        return n.Names(self.settings.deployment.namespace)

    async def submit(self, body: dict[str, Any]) -> str:
        """Submit once a gateway answers; the job id."""

        async def attempt() -> dict[str, Any] | None:
            try:
                return await self.client.submit(SubmitRequest(**body))
            except TRANSIENT:
                return None

        reply = await eventually(attempt, timeout=60, interval=0.2, what="gateway answers submit")
        return str(reply["job_id"])

    async def status(self, job_id: str) -> dict[str, Any] | None:
        """The job's status, or None while the gateway or its stores are unreachable."""
        try:
            return await self.client.status(job_id)
        except ApiError as exc:
            if exc.code == ErrorCode.UNAVAILABLE:
                return None
            raise
        except TRANSIENT:
            return None

    async def settle(self, job_id: str, *, timeout: float = 60) -> dict[str, Any]:
        """Wait (bounded) until the job is terminal; its status."""

        async def done() -> dict[str, Any] | None:
            status = await self.status(job_id)
            return status if status and status["state"] in TERMINAL else None

        return await eventually(
            done, timeout=timeout, interval=0.2, what=f"{job_id} settles", detail=self.procs.logs
        )

    def log_lines(self, prefix: str = "") -> list[dict[str, Any]]:
        """Every JSON log line of the processes whose name starts with ``prefix``."""
        out = []
        for name, proc in self.procs.procs.items():
            if not name.startswith(prefix):
                continue
            for line in proc.log_path.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    with contextlib.suppress(orjson.JSONDecodeError):
                        out.append(orjson.loads(line) | {"proc": name})
        return out

    def crash_points_hit(self) -> Counter[str]:
        """How many times each crash point fired (each one logs a line before its SIGKILL)."""
        hits: Counter[str] = Counter()
        for proc in self.procs.procs.values():
            for line in proc.log_path.read_text(errors="replace").splitlines():
                if line.startswith(CRASH_LINE):
                    hits[line[len(CRASH_LINE) :].split()[0]] += 1
        return hits

    def count_logged(self, *messages: str, prefix: str = "worker") -> int:
        """Log lines whose ``msg`` is one of ``messages``."""
        return sum(1 for line in self.log_lines(prefix) if line.get("msg") in messages)


#: log messages of a worker that met a copy of a message it must not render again
DUPLICATE_MESSAGES = (
    "tile already done",
    "lease held by another owner; backing off",
)


@asynccontextmanager
async def open_rig(
    env: Mapping[str, str], log_dir: Path, *, workers: int = 1, start: bool = True
) -> AsyncIterator[Rig]:
    """The rig on ``env``; with ``start``, all four services (``workers`` workers) supervised.

    Everything started here is stopped on exit: supervisor first (so it does not restart what
    is being stopped), then the processes by PID, then the connections.
    """
    settings = Settings.from_env(env)
    procs = ServiceProcesses(env, log_dir)
    supervisor = Supervisor(procs)
    nc = await nats.connect(
        list(settings.nats_urls),
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
    )
    try:
        db = await MetadataStore.connect(settings.database_url)
        try:
            objects = await open_object_store(settings.object_store)
            try:
                client = TesseraClient(nc, n.Names(settings.deployment.namespace), timeout=10)
                rig = Rig(procs, supervisor, settings, nc, client, db, objects)
                try:
                    if start:
                        procs.start_all(workers=workers)
                        supervisor.start()
                    yield rig
                finally:
                    await supervisor.stop()
                    for proc in procs.procs.values():  # all at once; stop_all waits in turn
                        proc.signal(signal.SIGCONT)
                        proc.signal(signal.SIGTERM)
                    await asyncio.to_thread(procs.stop_all)
            finally:
                await objects.close()
        finally:
            await db.close()
    finally:
        await nc.close()


def elapsed(since: float) -> float:
    """Seconds since ``since`` (a ``time.monotonic()`` reading)."""
    return time.monotonic() - since
