"""The metrics collector: queue depth and oldest-message age, every few seconds, and per
project its queued and in-flight tiles and core-second share (one query,
:data:`shared.metadata.projects.USAGE_SQL`).

It runs in the scheduler (one per deployment is enough; several schedulers export the same
values, so dashboards take ``max`` over instances). Each round is :func:`read_stats` — two
small JetStream requests per consumer and one per stream, independent of the backlog — and
sets the gauges of :class:`shared.service.metrics.Metrics`. A failed round is logged and skipped:
the gauges keep their last values until the next one.
"""

from __future__ import annotations

import asyncio
import contextlib

from shared.core.errors import RetryableError
from shared.nats.streams import read_stats
from shared.service.runtime import Runtime

__all__ = ["COLLECT_INTERVAL", "StreamCollector"]

COLLECT_INTERVAL = 5.0


class StreamCollector:
    """Refreshes the stream and consumer gauges of one process."""

    def __init__(self, rt: Runtime, *, interval: float = COLLECT_INTERVAL) -> None:
        self.rt = rt
        self.interval = interval
        self.log = rt.log.bind(component="stream-collector")

    async def collect_once(self) -> None:
        """One round: read every stream and consumer and the projects, set the gauges."""
        stats = await read_stats(self.rt.js, self.rt.topology)
        m = self.rt.metrics
        for stream, count in stats.messages.items():
            m.stream_messages.labels(stream=stream).set(count)
        for c in stats.consumers:
            labels = {"stream": c.stream, "consumer": c.consumer}
            m.consumer_pending.labels(**labels).set(c.pending)
            m.consumer_ack_pending.labels(**labels).set(c.ack_pending)
            m.consumer_oldest_age.labels(**labels).set(c.oldest_age)
        window = self.rt.settings.scheduler.fair_share_window
        for p in await self.rt.db.projects(window=window):
            m.project_queued.labels(project=p.name).set(p.queued)
            m.project_in_flight.labels(project=p.name).set(p.in_flight)
            m.project_share.labels(project=p.name).set(p.share)

    async def run(self, stop: asyncio.Event) -> None:
        """Collect every ``interval`` until ``stop`` (only when metrics are served)."""
        if self.rt.settings.process.metrics_port <= 0:
            return
        while not stop.is_set():
            try:
                await self.collect_once()
            except RetryableError as exc:
                self.log.warning("stream metrics not collected this round", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
