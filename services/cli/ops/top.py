"""``tessera top``: one snapshot of the whole system, and its rendering as text.

A snapshot reads NATS and PostgreSQL directly (an operator tool, with the same ``TESSERA_*``
environment as the services): stream depths and oldest-message ages
(:func:`shared.nats.streams.read_stats`), tiles in flight with the node holding each lease and
the lease's age (the leases bucket), jobs per state, tiles committed per second over a window
(the audit trail), the newest failures (audit rows with an error code) and the live workers
(the ``tessera-workers`` bucket: node, kernel threads, renderers, tiles in hand). Every read is
bounded, so refreshing every second is cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import orjson
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from proto import names as n
from proto.topology import Topology
from services.client.output import table_lines
from shared.core.lifecycle import JobState
from shared.metadata import AuditEvent, MetadataStore, ProjectView
from shared.metadata.ops import InFlightTile
from shared.nats.jetstream import retry_transient
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.nats.streams import StreamStats, read_stats

__all__ = ["LeaseView", "Snapshot", "render", "snapshot"]

_DELETED = {"DEL", "PURGE"}
#: seconds a lease read may take, retries included: over two tries of `top`'s 5 s JetStream timeout
LEASE_READ_TIMEOUT = 12.0


@dataclass(frozen=True)
class LeaseView:
    """Who holds a tile's lease, and since when (unix time; 0 if unknown)."""

    node: str
    attempt_id: str
    acquired_at: float


@dataclass(frozen=True)
class Snapshot:
    """Everything one frame of ``tessera top`` shows."""

    at: float
    namespace: str
    streams: StreamStats
    in_flight: list[tuple[InFlightTile, LeaseView | None]]
    jobs: dict[JobState, int]
    window: float
    tiles_per_second: float
    failures: list[AuditEvent]
    #: per project: queued and in-flight tiles, core-second share over ``share_window``
    projects: list[ProjectView] = field(default_factory=list)
    share_window: float = 0.0
    workers: list[WorkerInfo] = field(default_factory=list)


async def lease_of(js: JetStreamContext, bucket: str, key: str) -> LeaseView | None:
    """The current holder of lease ``key`` in ``bucket``, read from its backing stream."""

    async def attempt(budget: float) -> RawStreamMsg | None:
        try:
            return await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
        except NotFoundError:
            return None

    # transient errors retried, then StoreUnavailable: a frame never dies on a NATS hiccup
    raw = await retry_transient("lease read", attempt, timeout_total=LEASE_READ_TIMEOUT)
    if raw is None:
        return None
    if (raw.headers or {}).get("KV-Operation") in _DELETED or not raw.data:
        return None
    try:
        doc = orjson.loads(raw.data)
        return LeaseView(str(doc["node"]), str(doc["attempt_id"]), float(doc["acquired_at"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return LeaseView("?", "?", 0.0)


async def snapshot(
    js: JetStreamContext,
    topology: Topology,
    db: MetadataStore,
    *,
    window: float = 10.0,
    tiles: int = 20,
    failures: int = 8,
    share_window: float = 300.0,
) -> Snapshot:
    """Read one frame's worth of state."""
    bucket = topology.names.bucket(n.BUCKET_LEASES)
    flying = await db.ops.in_flight_tiles(limit=tiles)
    leases = [
        (t, await lease_of(js, bucket, n.lease_key_tile(t.job_id, t.tile_index))) for t in flying
    ]
    committed = await db.ops.tiles_committed_since(window)
    return Snapshot(
        at=time.time(),
        namespace=topology.prefix,
        streams=await read_stats(js, topology),
        in_flight=leases,
        jobs=await db.ops.job_state_counts(),
        window=window,
        tiles_per_second=committed / window if window > 0 else 0.0,
        failures=await db.ops.recent_failures(limit=failures),
        projects=await db.projects(window=share_window),
        share_window=share_window,
        workers=await LiveWorkers(js, topology.names.bucket(n.BUCKET_WORKERS)).list(),
    )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def _clock(at: datetime) -> str:
    return at.astimezone().strftime("%H:%M:%S")


def render(s: Snapshot) -> str:
    """The snapshot as a text frame (no terminal control codes)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(s.at))
    lines = [f"tessera top  {stamp}  namespace {s.namespace or '(default)'}", "", "STREAMS"]
    depth = s.streams.messages
    lines += table_lines(
        ("STREAM", "MESSAGES", "CONSUMER", "PENDING", "ACK PENDING", "REDELIVERED", "OLDEST"),
        [(c.stream, depth.get(c.stream, "?"), c.consumer, c.pending, c.ack_pending,
          c.redelivered, _age(c.oldest_age)) for c in s.streams.consumers],
    )  # fmt: skip
    others = [f"{name} {count}" for name, count in depth.items()
              if name not in {c.stream for c in s.streams.consumers}]  # fmt: skip
    lines += [f"other streams: {', '.join(others)}", ""]
    jobs = ", ".join(f"{state.value} {count}" for state, count in sorted(s.jobs.items()))
    lines += [f"JOBS  {jobs or 'none'}"]
    lines += [f"RATE  {s.tiles_per_second:.2f} tiles done/s (last {s.window:g}s)", ""]
    threads = sum(w.threads for w in s.workers)
    lines += [f"WORKERS ({len(s.workers)}, {threads} kernel threads)"]
    lines += table_lines(
        ("NODE", "THREADS", "IN HAND", "RENDERERS", "UP", "CURRENT"),
        [(w.node, w.threads, w.in_hand,
          " ".join(f"{name}/{version}" for name, version in sorted(w.renderers.items())),
          _age(max(0.0, s.at - w.started_at)),
          " ".join(f"{job[:8]}:{tile}" for job, tile in w.current[:4])
          + (f" +{len(w.current) - 4}" if len(w.current) > 4 else ""))
         for w in s.workers],
    )  # fmt: skip
    lines += ["", f"IN FLIGHT ({len(s.in_flight)})"]
    lines += table_lines(
        ("JOB", "TILE", "STATE", "SAMPLES", "WORKER", "LEASE AGE", "FENCE"),
        [(t.job_id, t.tile_index, t.state.value, f"{t.samples_done}/{t.spp}",
          lease.node if lease else "(no lease)",
          _age(s.at - lease.acquired_at) if lease and lease.acquired_at else "-", t.lease_fence)
         for t, lease in s.in_flight],
    )  # fmt: skip
    lines += ["", f"PROJECTS ({len(s.projects)}, share over the last {s.share_window:g}s)"]
    lines += table_lines(
        ("PROJECT", "WEIGHT", "MAX IN FLIGHT", "QUEUED", "IN FLIGHT", "SHARE"),
        [(p.name, f"{p.weight:g}", "-" if p.max_in_flight is None else p.max_in_flight,
          p.queued, p.in_flight, f"{100 * p.share:.1f}%") for p in s.projects],
    )  # fmt: skip
    lines += ["", f"RECENT FAILURES ({len(s.failures)})"]
    lines += table_lines(
        ("AT", "JOB", "TILE", "CODE", "TO", "NODE", "ERROR"),
        [(_clock(e.at), e.job_id, "" if e.tile_index is None else e.tile_index, e.error_code,
          e.to_state, e.node, (e.error or "")[:60]) for e in s.failures],
    )  # fmt: skip
    return "\n".join(lines)
