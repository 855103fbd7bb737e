"""Settings: built once from an injectable mapping, frozen, passed explicitly, grouped by concern.

Nothing reads the environment at import time. ``Settings.from_env(os.environ)`` validates every
value and raises :class:`~shared.core.errors.ConfigError` naming the variable that is missing or
malformed, so a service fails at start-up rather than at the first message.

A :class:`Settings` holds where the deployment's servers are (``nats_urls``, ``database_url``,
``object_store``) and who this process is (``node``), then one frozen group per concern:
``deployment`` (namespace and what JetStream objects are declared), ``leases``, ``delivery``,
``worker``, ``scheduler``, ``sweeper``, ``finalizer``, ``gateway``, ``client`` and ``process``
(logs, metrics, shutdown). Every knob is a field of one group, declared with :func:`_knob`: its
default, its ``TESSERA_*`` variable, its meaning and who reads it. That declaration is the only
default of the knob: every other place (:class:`proto.topology.Topology`, the caches, the
consume loops) takes its value from these settings or from the group's class attribute.

:func:`knob_table` renders every variable as the Markdown table in ``docs/operations.md``
(``python -m shared.core.config docs/operations.md`` rewrites it there; a test keeps the two equal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from shared.core.errors import ConfigError
from shared.core.retry import RetryPolicy

__all__ = [
    "ClientSettings",
    "DeliverySettings",
    "DeploymentSettings",
    "FinalizerSettings",
    "GatewaySettings",
    "LeaseSettings",
    "ObjectStoreSettings",
    "ProcessSettings",
    "SchedulerSettings",
    "Settings",
    "SweeperSettings",
    "WorkerSettings",
    "knob_table",
    "variables",
]

MiB = 1024 * 1024


def _knob(default: Any, env: str, doc: str, *, read_by: str, minimum: float | None = None) -> Any:
    """A settings field: ``default``, read from ``env``, documented by ``doc``.

    ``read_by`` names the processes that use it (the docs table's last column); ``minimum`` is
    the least value ``from_env`` accepts for a number.
    """
    meta = {"env": env, "doc": doc, "read_by": read_by, "min": minimum}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ObjectStoreSettings:
    """Where tile results, checkpoints and final images live."""

    kind: Literal["file", "s3"]
    #: directory for ``file``; unused for ``s3``
    path: str = ""
    #: bucket for ``s3``
    bucket: str = ""
    endpoint: str = ""
    access_key: str = ""
    secret_key: str = ""
    region: str = "us-east-1"

    def url(self) -> str:
        """The value of ``TESSERA_OBJECT_STORE`` that names this store."""
        return f"file://{self.path}" if self.kind == "file" else f"s3://{self.bucket}"


@dataclass(frozen=True)
class DeploymentSettings:
    """Which deployment a process belongs to, and the JetStream objects every service declares.

    Every service declares the same streams and consumers, so give all of them the same values.
    """

    #: prefix isolating one deployment's subjects, streams and buckets (tests use a fresh one)
    namespace: str = _knob(
        "",
        "TESSERA_NAMESPACE",
        "prefix isolating one deployment's subjects, streams, buckets (letters, digits, `-`, `_`)",
        read_by="all",
    )
    #: stream and bucket replicas (3 on a NATS cluster)
    replicas: int = _knob(
        1,
        "TESSERA_REPLICAS",
        "stream and bucket replicas (3 on a cluster)",
        read_by="services",
        minimum=1,
    )
    #: JetStream duplicate window (seconds) for Nats-Msg-Id de-duplication
    duplicate_window: int = _knob(
        120,
        "TESSERA_DUPLICATE_WINDOW",
        "JetStream `Nats-Msg-Id` de-duplication window of the streams (s)",
        read_by="services",
        minimum=1,
    )


@dataclass(frozen=True)
class LeaseSettings:
    """Tile and finalization leases: how long one lives, how often its owner renews it.

    The lease TTL is short and renewed every ``heartbeat_interval``; see docs/operations.md,
    "Tuning the clocks".
    """

    #: lease lifetime without a renew; whole seconds (JetStream per-key TTL granularity)
    ttl: int = _knob(
        10,
        "TESSERA_LEASE_TTL",
        "tile and finalization lease lifetime without a renew (whole seconds)",
        read_by="worker, finalizer, scheduler (sweeper)",
        minimum=1,
    )
    #: lease renew + ``in_progress()`` period; must be at most ``ttl / 2``
    heartbeat_interval: float = _knob(
        2.0,
        "TESSERA_HEARTBEAT_INTERVAL",
        "lease renew + `in_progress()` period, ≤ TTL/2",
        read_by="worker, finalizer",
        minimum=0.05,
    )


@dataclass(frozen=True)
class DeliverySettings:
    """How JetStream redelivers: the consumers' ack deadline and delivery bound, and the
    backoff of ``nak(delay=...)`` after a retryable failure."""

    #: JetStream ack deadline (the queue's visibility timeout); must exceed the lease TTL. Live
    #: owners extend it with every heartbeat, so it only bounds how soon a dead owner's tile is
    #: redelivered: just after its lease expired.
    ack_wait: int = _knob(
        12,
        "TESSERA_ACK_WAIT",
        "JetStream ack deadline of every consumer, > lease TTL (a dead owner's tile comes back "
        "this long after its last heartbeat)",
        read_by="services",
        minimum=2,
    )
    #: deliveries of one message before it is dead-lettered
    max_deliver: int = _knob(
        10,
        "TESSERA_MAX_DELIVER",
        "deliveries before a message is dead-lettered (retryable failures count too: with the "
        "default backoff, 10 ride out about 4 minutes of storage outage)",
        read_by="services",
        minimum=1,
    )
    #: retry backoff: base of the exponential delay for ``nak(delay=...)``
    retry_base: float = _knob(
        1.0,
        "TESSERA_RETRY_BASE",
        "exponential `nak(delay)` backoff of retryable failures: first delay (s)",
        read_by="services",
        minimum=0.0,
    )
    #: retry backoff: the longest delay
    retry_cap: float = _knob(
        60.0,
        "TESSERA_RETRY_CAP",
        "exponential `nak(delay)` backoff: longest delay (s), ≥ `RETRY_BASE`",
        read_by="services",
        minimum=0.0,
    )

    def retry_policy(self) -> RetryPolicy:
        """The backoff of ``nak(delay=...)`` after a retryable failure."""
        return RetryPolicy(base=self.retry_base, cap=self.retry_cap)


@dataclass(frozen=True)
class WorkerSettings:
    """A worker process: its kernel threads, the tiles it holds, its caches, its passes."""

    #: kernel threads per worker process (0 = number of cores)
    slots: int = _knob(
        0,
        "TESSERA_WORKER_SLOTS",
        "kernel threads per worker (0: number of cores)",
        read_by="worker",
        minimum=0,
    )
    #: tile messages a worker holds at once (0 = twice ``slots``, so renderers never wait for a
    #: tile's commit I/O)
    in_hand: int = _knob(
        0,
        "TESSERA_WORKER_IN_HAND",
        "tile messages a worker holds at once (0: twice its kernel threads, so renderers never "
        "wait for a tile's commit I/O)",
        read_by="worker",
        minimum=0,
    )
    #: seconds between checkpoints of a tile's accumulator
    checkpoint_interval: float = _knob(
        5.0,
        "TESSERA_CHECKPOINT_INTERVAL",
        "seconds between accumulator checkpoints",
        read_by="worker",
        minimum=0.0,
    )
    #: samples per pixel of a tile's first pass (and the least of any pass but its last)
    samples_per_pass: int = _knob(
        4,
        "TESSERA_SAMPLES_PER_PASS",
        "samples per pixel of a tile's first pass (and the least of any other)",
        read_by="worker",
        minimum=1,
    )
    #: later passes are sized from the measured rate to take about this long: a pass is the
    #: grain of cancel checks and checkpoints, and each costs a round trip to the event loop
    #: (0 = every pass has ``samples_per_pass``)
    pass_seconds: float = _knob(
        0.5,
        "TESSERA_PASS_SECONDS",
        "later passes are sized to take about this long (the grain of cancel, shutdown and "
        "checkpoint checks; 0: every pass has `SAMPLES_PER_PASS`), ≤ `PROGRESS_TIMEOUT`/2",
        read_by="worker",
        minimum=0.0,
    )
    #: a tile whose passes stop advancing for this long is aborted (progress watchdog)
    progress_timeout: float = _knob(
        120.0,
        "TESSERA_PROGRESS_TIMEOUT",
        "watchdog: abort a tile whose passes stop advancing for this long (s)",
        read_by="worker",
        minimum=1.0,
    )
    #: a finished tile result up to this many bytes (a small tile's float accumulator; 8x8 is
    #: 1.6 KiB) is committed inline in PostgreSQL, in the fenced commit's own statement,
    #: instead of as one object per tile; larger ones go to the object store (0 = all do)
    inline_result_bytes: int = _knob(
        16384,
        "TESSERA_INLINE_RESULT_BYTES",
        "tile results up to this size are committed inline in PostgreSQL instead of as one "
        "object each (0: all objects)",
        read_by="worker",
        minimum=0,
    )
    #: prepared scenes (flattened arrays + BVH) a worker keeps, by count ...
    scene_cache: int = _knob(
        8,
        "TESSERA_WORKER_SCENE_CACHE",
        "prepared scenes (flattened geometry + BVH) a worker keeps, least recently used "
        "dropped first",
        read_by="worker",
        minimum=1,
    )
    #: ... and by bytes of their arrays (a 200k-triangle mesh is ~40 MB); the newest scene
    #: always stays, whatever its size
    scene_cache_bytes: int = _knob(
        512 * MiB,
        "TESSERA_WORKER_SCENE_CACHE_BYTES",
        "bytes of prepared scene arrays a worker keeps (the newest scene stays whatever its size)",
        read_by="worker",
        minimum=0,
    )
    #: job rows a worker caches (what tiles need of a job never changes)
    job_cache: int = _knob(
        256,
        "TESSERA_WORKER_JOB_CACHE",
        "job rows a worker caches (scene, settings, input hash), least recently used dropped first",
        read_by="worker",
        minimum=1,
    )
    #: job ids announced cancelled that a worker remembers, oldest forgotten first
    cancel_memory: int = _knob(
        10_000,
        "TESSERA_WORKER_CANCEL_MEMORY",
        "cancelled job ids a worker remembers from job-cancelled events, oldest forgotten first",
        read_by="worker",
        minimum=1,
    )

    def kernel_threads(self) -> int:
        """``slots``, with 0 resolved to the number of cores."""
        return self.slots or os.cpu_count() or 1

    def tiles_in_hand(self) -> int:
        """``in_hand``, with 0 resolved to twice the kernel threads."""
        return self.in_hand or 2 * self.kernel_threads()


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler's consumers (its sweeper has :class:`SweeperSettings`)."""

    #: job messages the scheduler plans at once
    jobs_in_hand: int = _knob(
        8,
        "TESSERA_SCHEDULER_JOBS_IN_HAND",
        "job messages the scheduler plans at once",
        read_by="scheduler",
        minimum=1,
    )
    #: exhausted-delivery advisories the scheduler handles at once
    advisories_in_hand: int = _knob(
        4,
        "TESSERA_SCHEDULER_ADVISORIES_IN_HAND",
        "exhausted-delivery advisories the scheduler dead-letters at once",
        read_by="scheduler",
        minimum=1,
    )


@dataclass(frozen=True)
class SweeperSettings:
    """The scheduler's sweeper, which re-publishes tiles whose message was lost."""

    #: sweeper period
    interval: float = _knob(
        5.0,
        "TESSERA_SWEEP_INTERVAL",
        "sweeper period (s)",
        read_by="scheduler",
        minimum=0.1,
    )
    #: the age after which a stuck tile is re-published (must cover a normal redelivery)
    age: float = _knob(
        60.0,
        "TESSERA_SWEEP_AGE",
        "age of a stuck tile (no message, no lease) before it is re-published (s), > `ACK_WAIT`",
        read_by="scheduler",
        minimum=0.5,
    )
    #: tiles one sweep pass reads (a page; the next pass reads the next page)
    batch: int = _knob(
        1000,
        "TESSERA_SWEEP_BATCH",
        "stuck tiles one sweep pass reads, oldest publish first (the next pass reads the next)",
        read_by="scheduler",
        minimum=1,
    )


@dataclass(frozen=True)
class FinalizerSettings:
    """The finalizer: how many tile-done events it handles at once, what it reads ahead."""

    #: tile-done events the finalizer handles at once
    in_hand: int = _knob(
        4,
        "TESSERA_FINALIZER_IN_HAND",
        "tile-done events a finalizer handles at once",
        read_by="finalizer",
        minimum=1,
    )
    #: bytes of tile results a finalizer reads ahead as their tile-done events arrive, so a
    #: job's finalization does not start by reading every tile (0 = no read-ahead)
    read_ahead_bytes: int = _knob(
        256 * MiB,
        "TESSERA_READ_AHEAD_BYTES",
        "tile results a finalizer reads ahead as tile-done events arrive (0: none)",
        read_by="finalizer",
        minimum=0,
    )


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's bounded intake (see :mod:`services.gateway.intake`) and result URLs."""

    #: small requests (body below ``large_body_bytes``) served at once; more are ``busy``
    in_flight: int = _knob(
        64,
        "TESSERA_GATEWAY_IN_FLIGHT",
        "small requests (body below `GATEWAY_LARGE_BODY_BYTES`) a gateway serves at once; "
        "more are answered `busy`",
        read_by="gateway",
        minimum=1,
    )
    #: large requests (inline scenes) served at once; more are ``busy``
    large_in_flight: int = _knob(
        8,
        "TESSERA_GATEWAY_LARGE_IN_FLIGHT",
        "large requests (inline scenes) a gateway serves at once; more are answered `busy`",
        read_by="gateway",
        minimum=1,
    )
    #: processes decoding and checking large requests off the event loop
    large_workers: int = _knob(
        1,
        "TESSERA_GATEWAY_LARGE_WORKERS",
        "processes of a gateway that decode and check large requests off its event loop",
        read_by="gateway",
        minimum=1,
    )
    #: bodies of this size or more go to the large lane
    large_body_bytes: int = _knob(
        16 * 1024,
        "TESSERA_GATEWAY_LARGE_BODY_BYTES",
        "request bodies of this size or more are large (decoded in the gateway's worker process)",
        read_by="gateway",
        minimum=1,
    )
    #: lifetime (whole seconds) of a presigned result URL from ``tessera.api.result`` (S3):
    #: short, since anyone holding the URL can download the image until it expires
    result_url_ttl: int = _knob(
        300,
        "TESSERA_RESULT_URL_TTL",
        "lifetime of a presigned result URL (`tessera.api.result`, S3 store), whole seconds, at "
        "most 7 days; anyone holding the URL can download the image until then",
        read_by="gateway",
        minimum=1,
    )


@dataclass(frozen=True)
class ClientSettings:
    """What the ``tessera`` client commands fill in."""

    #: default tile edge in pixels when a request names none
    default_tile: int = _knob(
        64,
        "TESSERA_DEFAULT_TILE",
        "tile edge (pixels) `tessera submit` sends when the command names none",
        read_by="client",
        minimum=8,
    )


@dataclass(frozen=True)
class ProcessSettings:
    """Any service process: its logs, its metrics endpoint, its shutdown."""

    #: SIGTERM grace period: in-flight work is checkpointed and handed back within it
    grace_period: float = _knob(
        20.0,
        "TESSERA_GRACE_PERIOD",
        "SIGTERM: time to checkpoint and hand back in-flight work (s)",
        read_by="services",
        minimum=0.0,
    )
    #: Prometheus metrics port (0 disables the HTTP endpoint)
    metrics_port: int = _knob(
        0,
        "TESSERA_METRICS_PORT",
        "Prometheus `/metrics`, `/healthz`, `/readyz` port (0: off)",
        read_by="services",
        minimum=0,
    )
    #: address the metrics endpoint listens on (an IP address or a host name; every IPv4
    #: interface by default, ``127.0.0.1`` keeps it on the machine, ``::`` for IPv6)
    metrics_host: str = _knob(
        "0.0.0.0",
        "TESSERA_METRICS_HOST",
        "address that endpoint listens on: an IP address (`127.0.0.1` keeps it on the machine, "
        "`::` for IPv6) or a host name",
        read_by="services",
    )
    #: log level name
    log_level: str = _knob(
        "INFO",
        "TESSERA_LOG_LEVEL",
        "`DEBUG`, `INFO`, `WARNING` or `ERROR`",
        read_by="services",
    )


_GROUPS: dict[str, type[Any]] = {
    "deployment": DeploymentSettings,
    "leases": LeaseSettings,
    "delivery": DeliverySettings,
    "worker": WorkerSettings,
    "scheduler": SchedulerSettings,
    "sweeper": SweeperSettings,
    "finalizer": FinalizerSettings,
    "gateway": GatewaySettings,
    "client": ClientSettings,
    "process": ProcessSettings,
}
"""Each group of :class:`Settings`: attribute name -> class."""

_CONNECTIONS: tuple[tuple[str, str, str, str, str], ...] = (
    ("TESSERA_NATS_URL", "required", "NATS server URL(s), `nats://host:port`, comma-separated "
     "for a cluster", "nats_urls", "all"),
    ("TESSERA_DATABASE_URL", "required", "PostgreSQL DSN, `postgresql://user:pass@host:port/db` "
     "(the client commands do not use it)", "database_url", "services, operator tools"),
    ("TESSERA_OBJECT_STORE", "required", "`file:///absolute/dir` or `s3://bucket` (the client "
     "commands, `get` included, do not use it)", "object_store", "services, `tessera gc`"),
    ("TESSERA_S3_ENDPOINT", "empty (AWS)", "S3 endpoint URL", "object_store.endpoint",
     "services, `tessera gc`"),
    ("TESSERA_S3_ACCESS_KEY", "required for `s3://`", "S3 access key", "object_store.access_key",
     "services, `tessera gc`"),
    ("TESSERA_S3_SECRET_KEY", "required for `s3://`", "S3 secret key", "object_store.secret_key",
     "services, `tessera gc`"),
    ("TESSERA_S3_REGION", "`us-east-1`", "S3 region", "object_store.region",
     "services, `tessera gc`"),
    ("TESSERA_NODE", "`<hostname>-<pid>`", "this process's name in leases, attempts and logs",
     "node", "all"),
)  # fmt: skip
"""The variables that are not knobs of a group: variable, default, meaning, setting, reader."""


MAX_URL_TTL = 7 * 24 * 3600


@dataclass(frozen=True)
class Settings:
    """Everything a Tessera process needs to know, validated."""

    nats_urls: tuple[str, ...]
    database_url: str
    object_store: ObjectStoreSettings
    #: this process's name in leases, attempts and logs (default ``<hostname>-<pid>``)
    node: str = ""
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    sweeper: SweeperSettings = field(default_factory=SweeperSettings)
    finalizer: FinalizerSettings = field(default_factory=FinalizerSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, database: bool = True, object_store: bool = True
    ) -> Settings:
        """Build and validate settings from ``env`` (normally ``os.environ``).

        ``database=False`` (the client commands, which only talk to the gateways) makes
        ``TESSERA_DATABASE_URL`` optional: unset, ``database_url`` is empty; set, it is checked.
        ``object_store=False`` does the same for ``TESSERA_OBJECT_STORE`` (and the S3
        variables): unset, the store is a ``file`` store without a path, which nothing opens.
        """
        node = env.get("TESSERA_NODE", "").strip() or f"{socket.gethostname()}-{os.getpid()}"
        need_db = database or bool(env.get("TESSERA_DATABASE_URL", "").strip())
        need_store = object_store or bool(env.get("TESSERA_OBJECT_STORE", "").strip())
        groups = {name: _group(group, env) for name, group in _GROUPS.items()}
        settings = cls(
            nats_urls=_nats_urls(_required(env, "TESSERA_NATS_URL")),
            database_url=(_database_url(_required(env, "TESSERA_DATABASE_URL")) if need_db else ""),
            object_store=_object_store(env) if need_store else ObjectStoreSettings(kind="file"),
            node=node,
            **groups,
        )
        _check_relations(settings)
        return settings

    def to_env(self) -> dict[str, str]:
        """The environment lines that rebuild these settings in another process."""
        out = {
            "TESSERA_NATS_URL": ",".join(self.nats_urls),
            "TESSERA_DATABASE_URL": self.database_url,
            "TESSERA_OBJECT_STORE": self.object_store.url(),
        }
        if self.object_store.kind == "s3":
            out |= {
                "TESSERA_S3_ENDPOINT": self.object_store.endpoint,
                "TESSERA_S3_ACCESS_KEY": self.object_store.access_key,
                "TESSERA_S3_SECRET_KEY": self.object_store.secret_key,
                "TESSERA_S3_REGION": self.object_store.region,
            }
        for name, f in _knobs():
            value = getattr(getattr(self, name), f.name)
            if value != f.default:
                out[f.metadata["env"]] = str(value)
        return out


def _knobs() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """``(group attribute, field)`` of every knob, in declaration order."""
    for name, group in _GROUPS.items():
        for f in dataclasses.fields(group):
            yield name, f


def variables() -> set[str]:
    """Every ``TESSERA_*`` variable :meth:`Settings.from_env` reads."""
    return {row[0] for row in _CONNECTIONS} | {f.metadata["env"] for _, f in _knobs()}


def knob_table() -> str:
    """Every variable as a Markdown table: variable, default, meaning, setting, who reads it."""
    lines = [
        "| variable | default | meaning | setting | read by |",
        "|---|---|---|---|---|",
    ]
    for env, default, doc, setting, read_by in _CONNECTIONS:
        lines.append(f"| `{env}` | {default} | {doc} | `{setting}` | {read_by} |")
    for name, f in _knobs():
        default = f"`{f.default}`" if f.default != "" else "empty"
        lines.append(
            f"| `{f.metadata['env']}` | {default} | {f.metadata['doc']} | "
            f"`{name}.{f.name}` | {f.metadata['read_by']} |"
        )
    return "\n".join(lines) + "\n"


TABLE_BEGIN = "<!-- knobs: generated by `python -m shared.core.config docs/operations.md` -->\n"
TABLE_END = "<!-- knobs: end -->\n"


def documented_table(text: str) -> str:
    """The generated table inside ``text`` (between :data:`TABLE_BEGIN` and :data:`TABLE_END`)."""
    start, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError("no generated knob table (its begin and end markers) in the text")
    return text[start + len(TABLE_BEGIN) : end]


def _write_table(path: Path) -> None:
    text = path.read_text()
    old = documented_table(text)
    start = text.find(TABLE_BEGIN) + len(TABLE_BEGIN)
    path.write_text(text[:start] + knob_table() + text[start + len(old) :])


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set (see the Configuration section of the README)")
    return value


def _nats_urls(raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls") or not parts.hostname:
            raise ConfigError(
                f"TESSERA_NATS_URL: {url!r} is not a nats://host:port URL "
                "(several servers are separated by commas)"
            )
        _port_of("TESSERA_NATS_URL", url)
    return urls


def _port_of(name: str, url: str) -> None:
    try:
        urlsplit(url).port  # noqa: B018 - accessing .port validates it
    except ValueError as exc:
        raise ConfigError(f"{name}: {url!r} has an invalid port") from exc


def _database_url(raw: str) -> str:
    parts = urlsplit(raw)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"TESSERA_DATABASE_URL: {raw!r} is not a postgresql://user@host:port/db DSN"
        )
    _port_of("TESSERA_DATABASE_URL", raw)
    return raw


def _object_store(env: Mapping[str, str]) -> ObjectStoreSettings:
    raw = _required(env, "TESSERA_OBJECT_STORE")
    parts = urlsplit(raw)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise ConfigError(
                f"TESSERA_OBJECT_STORE: {raw!r} must be file:///absolute/path (three slashes)"
            )
        return ObjectStoreSettings(kind="file", path=parts.path)
    if parts.scheme == "s3":
        if not parts.netloc or parts.path not in ("", "/"):
            raise ConfigError(f"TESSERA_OBJECT_STORE: {raw!r} must be s3://bucket")
        endpoint = env.get("TESSERA_S3_ENDPOINT", "").strip()
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError(f"TESSERA_S3_ENDPOINT: {endpoint!r} is not an http(s) URL")
        return ObjectStoreSettings(
            kind="s3",
            bucket=parts.netloc,
            endpoint=endpoint,
            access_key=_required(env, "TESSERA_S3_ACCESS_KEY"),
            secret_key=_required(env, "TESSERA_S3_SECRET_KEY"),
            region=env.get("TESSERA_S3_REGION", "").strip() or "us-east-1",
        )
    raise ConfigError(f"TESSERA_OBJECT_STORE: {raw!r} must start with file:/// or s3://")


def _group(group: type[Any], env: Mapping[str, str]) -> Any:
    """One settings group from the variables of its knobs (unset ones keep their default)."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(group):
        name: str = f.metadata["env"]
        raw = env.get(name, "").strip()
        if not raw:
            continue
        minimum = f.metadata["min"]
        if f.type == "int":
            values[f.name] = _int(name, raw, int(minimum))
        elif f.type == "float":
            values[f.name] = _float(name, raw, float(minimum))
        else:
            values[f.name] = raw
    return group(**values)


def _int(name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _float(name: str, raw: str, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if not (value >= minimum and value < float("inf")):
        raise ConfigError(f"{name}={raw} must be a finite number >= {minimum}")
    return value


def _check_relations(s: Settings) -> None:
    leases, delivery, worker, process = s.leases, s.delivery, s.worker, s.process
    if leases.heartbeat_interval * 2 > leases.ttl:
        raise ConfigError(
            f"TESSERA_HEARTBEAT_INTERVAL={leases.heartbeat_interval} must be at most half of "
            f"TESSERA_LEASE_TTL={leases.ttl}, or one late renew loses the lease"
        )
    if delivery.ack_wait <= leases.ttl:
        raise ConfigError(
            f"TESSERA_ACK_WAIT={delivery.ack_wait} must exceed TESSERA_LEASE_TTL={leases.ttl}, "
            "so a dead owner's lease expires before its message is redelivered"
        )
    if worker.pass_seconds * 2 > worker.progress_timeout:
        raise ConfigError(
            f"TESSERA_PASS_SECONDS={worker.pass_seconds} must be at most half of "
            f"TESSERA_PROGRESS_TIMEOUT={worker.progress_timeout}, or the watchdog aborts healthy "
            "passes"
        )
    if delivery.retry_cap < delivery.retry_base:
        raise ConfigError(f"TESSERA_RETRY_CAP={delivery.retry_cap} must be >= TESSERA_RETRY_BASE")
    if s.gateway.result_url_ttl > MAX_URL_TTL:
        raise ConfigError(
            f"TESSERA_RESULT_URL_TTL={s.gateway.result_url_ttl} must be at most {MAX_URL_TTL} "
            "(7 days, the longest an S3 signature is valid)"
        )
    namespace = s.deployment.namespace
    if namespace and not namespace.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(
            f"TESSERA_NAMESPACE={namespace!r} may hold only letters, digits, '-' and '_'"
        )
    if not _is_host(process.metrics_host):
        raise ConfigError(
            f"TESSERA_METRICS_HOST={process.metrics_host!r} must be an IP address or a host name"
        )
    if process.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"TESSERA_LOG_LEVEL={process.log_level!r} must be DEBUG, INFO, WARNING or ERROR"
        )


def _is_host(value: str) -> bool:
    """An IP address literal, or a host name (RFC 1123 labels)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return True
    labels = value.rstrip(".").split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


if __name__ == "__main__":  # python -m shared.core.config docs/operations.md
    if len(sys.argv) != 2:
        print(
            "usage: python -m shared.core.config FILE  (rewrites FILE's knob table)",
            file=sys.stderr,
        )
        sys.exit(2)
    _write_table(Path(sys.argv[1]))
