"""The groups every process or every service reads: deployment, leases, delivery, client, process.

Also :class:`ObjectStoreSettings`, where the results live. The groups of one service role each
(worker, scheduler, sweeper, finalizer, gateway) are in :mod:`shared.core.config.roles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.core.config.knobs import _knob
from shared.core.retry import RetryPolicy

MAX_MALLOC_REUSE = 32 * 1024 * 1024
"""The largest ``TESSERA_MALLOC_REUSE_BYTES``: glibc's top mmap threshold on 64-bit."""


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
class ClientSettings:
    """What the ``tessera`` client commands fill in."""

    #: default tile edge in pixels when a request names none, or ``auto``
    default_tile: str = _knob(
        "auto",
        "TESSERA_DEFAULT_TILE",
        "tile edge `tessera submit` sends when the command names none: `auto` (the scheduler "
        "picks it, see TESSERA_TILE_SECONDS) or pixels (8..1024)",
        read_by="client",
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
    #: allocations below this many bytes reuse memory the process freed earlier instead of
    #: fresh pages from the OS, and up to twice it stays free for that (glibc;
    #: :mod:`shared.service.memory`)
    malloc_reuse_bytes: int = _knob(
        MAX_MALLOC_REUSE,
        "TESSERA_MALLOC_REUSE_BYTES",
        "allocations below this size reuse memory freed earlier instead of fresh pages, and up "
        "to twice it stays free in the process for that (glibc; 0: the C library's defaults; "
        f"at most {MAX_MALLOC_REUSE})",
        read_by="services",
        minimum=0,
        maximum=(MAX_MALLOC_REUSE, "the largest mmap threshold glibc accepts"),
    )
    #: log level name
    log_level: str = _knob(
        "INFO",
        "TESSERA_LOG_LEVEL",
        "`DEBUG`, `INFO`, `WARNING` or `ERROR`",
        read_by="services",
    )
