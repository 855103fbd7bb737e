"""The console's data verbs: job.tiles, job.timeline, job.preview, workers, farm.

Read-only views for the web console (and any client): a job's tiles with their audit counts,
its audit trail a page at a time, the image so far (:mod:`services.gateway.preview`), the live
workers (the ``tessera-workers`` bucket, as ``tessera top`` reads it) and the farm's operational
numbers (JetStream's stream and consumer stats, as ``tessera top`` reads them, and the audit
trail over a window). Every reply stays within the gateway's reply budget: the tile rows and
the timeline end a page early (``next_offset``, ``next_before_id``) rather than grow past it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from proto import names as n
from proto.api import (
    FarmRequest,
    JobPreviewRequest,
    JobTilesRequest,
    JobTimelineRequest,
    WorkersRequest,
    decode_request,
)
from proto.api_replies import (
    TILE_COLUMNS,
    FarmReply,
    JobPreviewReply,
    JobTilesReply,
    JobTimelineReply,
    TimelineEvent,
    WorkersReply,
    WorkerView,
)
from services.gateway.preview import Previews
from services.gateway.views import iso, within_budget
from shared.metadata import AuditEvent
from shared.metadata.console import TileRow
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.nats.streams import read_stats
from shared.service.runtime import Runtime

__all__ = ["ConsoleHandlers"]

Headers = Mapping[str, str] | None
_ENVELOPE = 2048  # a reply's fields besides its rows, with room to spare


def tile_row(t: TileRow, spp: int) -> list[int | str | None]:
    """One ``job.tiles`` row, the values of :data:`~proto.api_replies.TILE_COLUMNS`."""
    return [t.tile_index, t.x0, t.y0, t.x1 - t.x0, t.y1 - t.y0, t.state.value, t.samples_done,
            spp, t.attempts, t.takeovers, t.resumes, t.last_error_code, t.last_error,
            t.node]  # fmt: skip


def timeline_event(e: AuditEvent) -> TimelineEvent:
    """The reply form of an audit row."""
    return TimelineEvent(
        id=e.id,
        at=iso(e.at),
        kind=e.trigger,
        entity=e.entity,
        tile_index=e.tile_index,
        attempt_id=e.attempt_id,
        node=e.node,
        from_state=e.from_state,
        to_state=e.to_state,
        detail=e.detail,
        error_code=e.error_code,
        error=e.error,
    )


def worker_view(w: WorkerInfo, now: float) -> WorkerView:
    """The reply form of a live worker's announcement."""
    return WorkerView(
        node=w.node,
        threads=w.threads,
        in_hand=w.in_hand,
        renderers=dict(sorted(w.renderers.items())),
        version=w.version,
        started_at=datetime.fromtimestamp(w.started_at, UTC).isoformat(),
        uptime_s=round(max(0.0, now - w.started_at), 3),
        current_tiles=[ref for c in w.current if (ref := _tile_ref(c)) is not None],
    )


def _tile_ref(value: list[Any]) -> list[str | int] | None:
    """``[job_id, tile_index]`` of a worker's announced tile; None for anything else."""
    if len(value) != 2 or not isinstance(value[0], str):
        return None
    index = value[1]
    return [value[0], index] if isinstance(index, int) and not isinstance(index, bool) else None


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


class ConsoleHandlers:
    """The console verbs of one gateway (its runtime's stores and connections)."""

    def __init__(self, rt: Runtime, *, reply_budget: int) -> None:
        self.rt = rt
        self.budget = max(1024, reply_budget - _ENVELOPE)
        self.workers_kv = LiveWorkers(rt.js, rt.names.bucket(n.BUCKET_WORKERS))
        self.previews = Previews(rt.db, rt.store, rt.progress, reply_budget=reply_budget)

    async def job_tiles(self, data: bytes, headers: Headers) -> JobTilesReply:
        """``tessera.api.job.tiles``: the job's tiles from ``offset``, as many as fit."""
        request = decode_request(data, headers, JobTilesRequest)
        job = await self.rt.db.console.job(request.job_id)
        rows = await self.rt.db.console.tiles(job.job_id, offset=request.offset)
        kept: list[list[int | str | None]] = []
        used, next_offset = 0, None
        for t in rows:
            row = tile_row(t, job.spp)
            used += len(orjson.dumps(row)) + 1
            if kept and used > self.budget:
                next_offset = t.tile_index
                break
            kept.append(row)
        return JobTilesReply(
            job_id=job.job_id,
            width=job.width,
            height=job.height,
            tile_size=job.tile_size,
            renderer=job.renderer,
            state=job.state.value,
            spp=job.spp,
            tiles_total=job.tiles_total,
            columns=list(TILE_COLUMNS),
            tiles=kept,
            offset=request.offset,
            next_offset=next_offset,
        )

    async def job_timeline(self, data: bytes, headers: Headers) -> JobTimelineReply:
        """``tessera.api.job.timeline``: a page of the job's audit rows, newest first."""
        request = decode_request(data, headers, JobTimelineRequest)
        job = await self.rt.db.console.job(request.job_id)
        rows = await self.rt.db.console.timeline(
            job.job_id, limit=request.limit + 1, before_id=request.before_id
        )
        page = within_budget([timeline_event(e) for e in rows[: request.limit]], self.budget)
        more = len(rows) > len(page)
        return JobTimelineReply(
            job_id=job.job_id, events=page, next_before_id=page[-1].id if more else None
        )

    async def job_preview(self, data: bytes, headers: Headers) -> JobPreviewReply:
        """``tessera.api.job.preview``: the image so far (cached; see :mod:`.preview`)."""
        request = decode_request(data, headers, JobPreviewRequest)
        job = await self.rt.db.console.job(request.job_id)
        return await self.previews.preview(job, request.max_edge)

    async def workers(self, data: bytes, headers: Headers) -> WorkersReply:
        """``tessera.api.workers``: the live workers, by node."""
        request = decode_request(data, headers, WorkersRequest)
        live = await self.workers_kv.list()
        if request.renderer is not None:
            live = [w for w in live if request.renderer in w.renderers]
        now = time.time()
        views = within_budget([worker_view(w, now) for w in live], self.budget)
        return WorkersReply(
            workers=views,
            threads=sum(w.threads for w in live),
            at=datetime.fromtimestamp(now, UTC).isoformat(),
        )

    async def farm(self, data: bytes, headers: Headers) -> FarmReply:
        """``tessera.api.farm``: depths and ages from JetStream, rates from the audit trail."""
        request = decode_request(data, headers, FarmRequest)
        stats = await read_stats(self.rt.js, self.rt.topology)
        audit = await self.rt.db.console.farm(window=request.window)
        unreleased = await self.rt.db.unreleased_tiles()
        names = self.rt.names
        tiles = [c for c in stats.consumers if c.stream == names.stream(n.STREAM_TILES)]
        p50, p95, p99 = audit.latency
        return FarmReply(
            queue_depth=sum(c.pending for c in tiles) + unreleased,
            oldest_age_s=round(max((c.oldest_age for c in stats.consumers), default=0.0), 3),
            in_flight=sum(c.ack_pending for c in tiles),
            retry_rate=_ratio(audit.retryable, audit.tile_attempts),
            duplicates_suppressed=audit.fenced,
            lease_renewal_failures=audit.lease_lost,
            resume_rate=_ratio(audit.resumed, audit.tile_attempts),
            latency_p50_s=_seconds(p50),
            latency_p95_s=_seconds(p95),
            latency_p99_s=_seconds(p99),
            dlq_size=stats.messages.get(names.stream(n.STREAM_DLQ), 0),
            finalization_failures=audit.final_failures,
            window_s=request.window,
            at=datetime.now(UTC).isoformat(),
        )
