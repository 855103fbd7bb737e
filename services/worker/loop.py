"""The worker process: N tile slots over the shared ``workers`` consumer."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict

from nats.aio.msg import Msg

from proto import names as n
from services.consume import consume
from services.settle import Delivery
from services.worker.context import JobCache, NatsTileEvents, StopView, TileContext
from services.worker.kernels import KernelThreads
from services.worker.scenes import SceneCache
from services.worker.tile import TileRun
from shared.metadata import Job
from shared.runtime import Runtime

__all__ = ["Worker"]


class Worker:
    """Fetches one TILES message per free slot and renders it on a thread of its own."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="worker")
        self.slots = rt.settings.tuning.worker_slots or os.cpu_count() or 1
        self.kernels = KernelThreads(self.slots)
        # Tiles in hand: twice the renderers, so while one tile of a slot does its I/O (result
        # write, fenced commit, tile-done, release, ack; then fetch, lease, fence the next) the
        # other's passes keep the core busy. Passes of the tiles in hand share the threads.
        self.in_hand = 2 * self.slots
        self.scenes = SceneCache()
        self.handing_back = asyncio.Event()
        #: jobs announced cancelled (job-cancelled events); bounded, oldest forgotten first
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        self.jobs = JobCache(rt.db)
        self.context = TileContext(
            db=rt.db,
            leases=rt.leases,
            progress=rt.progress,
            store=rt.store,
            events=NatsTileEvents(rt, self.log),
            jobs=self.jobs,
            scenes=self.scenes,
            kernels=self.kernels,
            stop=StopView(self.handing_back, self.cancelled),
            metrics=rt.metrics,
            tuning=rt.settings.tuning,
            retry=rt.retry,
            node=rt.node,
            log=self.log,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop``; then hand in-flight tiles back within the grace period."""
        cancels = await self.rt.nc.subscribe(
            self.rt.names.event_filter(n.EventKind.JOB_CANCELLED), cb=self._on_cancel
        )
        try:
            await consume(
                self.rt.js,
                stream=self.rt.names.stream(n.STREAM_TILES),
                durable=n.CONSUMER_WORKERS,
                handler=self.handle,
                slots=self.in_hand,
                stop=stop,
                log=self.log,
                grace=self.rt.settings.tuning.grace_period,
                on_stop=self.handing_back.set,
            )
        finally:
            await cancels.unsubscribe()
            self.kernels.executor.shutdown(wait=False, cancel_futures=True)

    async def _on_cancel(self, msg: Msg) -> None:
        # The subject's job token is enough; the event body is for watchers.
        job_id = msg.subject.split(".")[-2]
        self.cancelled[job_id] = None
        while len(self.cancelled) > 10_000:
            self.cancelled.popitem(last=False)

    async def handle(self, msg: Msg) -> None:
        """One delivery."""
        await TileRun(self.context, Delivery.of(self.rt, msg)).run()

    async def job(self, job_id: str) -> Job | None:
        """The job row, from the worker's cache (:class:`~services.worker.context.JobCache`)."""
        return await self.jobs.get(job_id)
