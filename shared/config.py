"""Settings: built once from an injectable mapping, frozen, passed explicitly.

Nothing reads the environment at import time. ``Settings.from_env(os.environ)`` validates every
value and raises :class:`~shared.errors.ConfigError` naming the variable that is missing or
malformed, so a service fails at start-up rather than at the first message.

Required:

=========================  ==================================================================
``TESSERA_NATS_URL``       one or more ``nats://host:port`` URLs, comma-separated (a cluster)
``TESSERA_DATABASE_URL``   a PostgreSQL DSN, ``postgresql://user:pass@host:port/db``
``TESSERA_OBJECT_STORE``   ``file:///absolute/dir`` or ``s3://bucket`` (then the S3 variables)
=========================  ==================================================================

For ``s3://``: ``TESSERA_S3_ENDPOINT`` (URL; empty means AWS), ``TESSERA_S3_ACCESS_KEY``,
``TESSERA_S3_SECRET_KEY``, ``TESSERA_S3_REGION`` (default ``us-east-1``).

The tuning knobs and their defaults are the fields of :class:`Tuning`; each is read from
``TESSERA_<FIELD NAME IN UPPER CASE>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from shared.errors import ConfigError

__all__ = ["ObjectStoreSettings", "Settings", "Tuning"]


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
class Tuning:
    """Tuning knobs, all with defaults. Times are seconds.

    The relations between them matter (see docs/operations.md): the lease TTL is short and
    renewed every ``heartbeat_interval``; ``ack_wait`` is longer than the TTL so a dead owner's
    lease expires before the message is redelivered.
    """

    #: lease lifetime without a renew; whole seconds (JetStream per-key TTL granularity)
    lease_ttl: int = 10
    #: lease renew + ``in_progress()`` period; must be below ``lease_ttl / 2``
    heartbeat_interval: float = 2.0
    #: JetStream ack deadline (the queue's visibility timeout); must exceed ``lease_ttl``. Live
    #: owners extend it with every heartbeat, so it only bounds how soon a dead owner's tile is
    #: redelivered: just after its lease expired.
    ack_wait: int = 12
    #: deliveries of one tile message before it is dead-lettered
    max_deliver: int = 10
    #: seconds between checkpoints of a tile's accumulator
    checkpoint_interval: float = 5.0
    #: samples per pixel of a tile's first pass (and the least of any pass but its last)
    samples_per_pass: int = 4
    #: later passes are sized from the measured rate to take about this long: a pass is the
    #: grain of cancel checks and checkpoints, and each costs a round trip to the event loop
    #: (0 = every pass has ``samples_per_pass``)
    pass_seconds: float = 0.5
    #: a finished tile result up to this many bytes (a small tile's float accumulator; 8x8 is
    #: 1.6 KiB) is committed inline in PostgreSQL, in the fenced commit's own statement,
    #: instead of as one object per tile; larger ones go to the object store (0 = all do)
    inline_result_bytes: int = 16384
    #: bytes of tile results a finalizer reads ahead as their tile-done events arrive, so a
    #: job's finalization does not start by reading every tile (0 = no read-ahead)
    read_ahead_bytes: int = 256 * 1024 * 1024
    #: kernel threads per worker process (0 = number of cores); the worker holds twice as many
    #: tiles, so renderers never wait for a tile's commit I/O
    worker_slots: int = 0
    #: a tile whose passes stop advancing for this long is aborted (progress watchdog)
    progress_timeout: float = 120.0
    #: sweeper period, and the age after which a stuck tile is re-published
    sweep_interval: float = 5.0
    sweep_age: float = 60.0
    #: retry backoff: base and cap of the exponential delay for ``nak(delay=...)``
    retry_base: float = 1.0
    retry_cap: float = 60.0
    #: lifetime (whole seconds) of a presigned result URL from ``tessera.api.result`` (S3):
    #: short, since anyone holding the URL can download the image until it expires
    result_url_ttl: int = 300
    #: default tile edge in pixels when a request names none
    default_tile: int = 64
    #: SIGTERM grace period: in-flight tiles are checkpointed and handed back within it
    grace_period: float = 20.0
    #: JetStream duplicate window (seconds) for Nats-Msg-Id de-duplication
    duplicate_window: int = 120
    #: stream and bucket replicas (3 on a NATS cluster)
    replicas: int = 1
    #: prefix isolating one deployment's subjects, streams and buckets (tests use a fresh one)
    namespace: str = ""
    #: Prometheus metrics port (0 disables the HTTP endpoint)
    metrics_port: int = 0
    #: address the metrics endpoint listens on (an IP address or a host name; every IPv4
    #: interface by default, ``127.0.0.1`` keeps it on the machine, ``::`` for IPv6)
    metrics_host: str = "0.0.0.0"
    #: log level name
    log_level: str = "INFO"


MAX_URL_TTL = 7 * 24 * 3600

_DURATION_MIN: dict[str, float] = {
    "heartbeat_interval": 0.05,
    "checkpoint_interval": 0.0,
    "pass_seconds": 0.0,
    "progress_timeout": 1.0,
    "sweep_interval": 0.1,
    "sweep_age": 0.5,
    "retry_base": 0.0,
    "retry_cap": 0.0,
    "grace_period": 0.0,
}
_INT_MIN: dict[str, int] = {
    "lease_ttl": 1,
    "ack_wait": 2,
    "max_deliver": 1,
    "samples_per_pass": 1,
    "inline_result_bytes": 0,
    "read_ahead_bytes": 0,
    "worker_slots": 0,
    "default_tile": 8,
    "result_url_ttl": 1,
    "duplicate_window": 1,
    "replicas": 1,
    "metrics_port": 0,
}


@dataclass(frozen=True)
class Settings:
    """Everything a Tessera process needs to know, validated."""

    nats_urls: tuple[str, ...]
    database_url: str
    object_store: ObjectStoreSettings
    tuning: Tuning = field(default_factory=Tuning)
    #: this process's name in leases, attempts and logs (default ``<hostname>-<pid>``)
    node: str = ""

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
        return cls(
            nats_urls=_nats_urls(_required(env, "TESSERA_NATS_URL")),
            database_url=(_database_url(_required(env, "TESSERA_DATABASE_URL")) if need_db else ""),
            object_store=_object_store(env) if need_store else ObjectStoreSettings(kind="file"),
            tuning=_tuning(env),
            node=node,
        )

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
        for f in dataclasses.fields(Tuning):
            value = getattr(self.tuning, f.name)
            if value != f.default:
                out[f"TESSERA_{f.name.upper()}"] = str(value)
        return out


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


def _tuning(env: Mapping[str, str]) -> Tuning:
    values: dict[str, object] = {}
    for f in dataclasses.fields(Tuning):
        name = f"TESSERA_{f.name.upper()}"
        raw = env.get(name, "").strip()
        if not raw:
            continue
        if f.name in _INT_MIN:
            values[f.name] = _int(name, raw, _INT_MIN[f.name])
        elif f.name in _DURATION_MIN:
            values[f.name] = _float(name, raw, _DURATION_MIN[f.name])
        else:
            values[f.name] = raw
    tuning = Tuning(**values)  # type: ignore[arg-type]
    _check_relations(tuning)
    return tuning


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


def _check_relations(t: Tuning) -> None:
    if t.heartbeat_interval * 2 > t.lease_ttl:
        raise ConfigError(
            f"TESSERA_HEARTBEAT_INTERVAL={t.heartbeat_interval} must be at most half of "
            f"TESSERA_LEASE_TTL={t.lease_ttl}, or one late renew loses the lease"
        )
    if t.ack_wait <= t.lease_ttl:
        raise ConfigError(
            f"TESSERA_ACK_WAIT={t.ack_wait} must exceed TESSERA_LEASE_TTL={t.lease_ttl}, "
            "so a dead owner's lease expires before its message is redelivered"
        )
    if t.pass_seconds * 2 > t.progress_timeout:
        raise ConfigError(
            f"TESSERA_PASS_SECONDS={t.pass_seconds} must be at most half of "
            f"TESSERA_PROGRESS_TIMEOUT={t.progress_timeout}, or the watchdog aborts healthy passes"
        )
    if t.retry_cap < t.retry_base:
        raise ConfigError(f"TESSERA_RETRY_CAP={t.retry_cap} must be >= TESSERA_RETRY_BASE")
    if t.result_url_ttl > MAX_URL_TTL:
        raise ConfigError(
            f"TESSERA_RESULT_URL_TTL={t.result_url_ttl} must be at most {MAX_URL_TTL} "
            "(7 days, the longest an S3 signature is valid)"
        )
    if t.namespace and not t.namespace.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(
            f"TESSERA_NAMESPACE={t.namespace!r} may hold only letters, digits, '-' and '_'"
        )
    if not _is_host(t.metrics_host):
        raise ConfigError(
            f"TESSERA_METRICS_HOST={t.metrics_host!r} must be an IP address or a host name"
        )
    if t.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"TESSERA_LOG_LEVEL={t.log_level!r} must be DEBUG, INFO, WARNING or ERROR"
        )


def _is_host(value: str) -> bool:
    """An IP address literal, or a host name (RFC 1123 labels)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return True
    labels = value.rstrip(".").split(".")
    return len(value) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
