"""The worker process: tiles in hand from the shared ``workers`` consumer, on kernel threads."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from nats.aio.msg import Msg

from proto import names as n
from services.worker.context import JobCache, NatsTileEvents, StopView, TileContext
from services.worker.kernels import KernelThreads
from services.worker.presence import Presence
from services.worker.scenes import SceneCache
from services.worker.tile import TileRun
from shared.metadata import Job
from shared.service.consume import consume
from shared.service.runtime import Runtime
from shared.service.settle import Delivery

__all__ = ["Worker"]


class Worker:
    """Holds up to ``in_hand`` TILES messages and renders their passes on ``slots`` kernel
    threads."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="worker")
        config = rt.settings.worker
        #: kernel threads
        self.slots = config.kernel_threads()
        self.kernels = KernelThreads(self.slots)
        # Tiles in hand: by default twice the kernel threads, so while one tile of a thread does
        # its I/O (result write, fenced commit, tile-done, release, ack; then fetch, lease,
        # fence the next) the other's passes keep the core busy. Passes of the tiles in hand
        # share the threads.
        self.in_hand = config.tiles_in_hand()
        self.scenes = SceneCache(config.scene_cache, config.scene_cache_bytes)
        self._cancel_memory = config.cancel_memory
        self.handing_back = asyncio.Event()
        #: jobs announced cancelled (job-cancelled events); bounded, oldest forgotten first
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        self.jobs = JobCache(rt.db, config.job_cache)
        #: subjects of the TILES messages in hand (``tessera top`` shows their tiles)
        self.current: dict[int, str] = {}
        self.presence = Presence(
            rt, threads=self.slots, in_hand=self.in_hand, current=self._current_tiles
        )
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
            lease_config=rt.settings.leases,
            worker_config=config,
            retry=rt.retry,
            node=rt.node,
            log=self.log,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop``; then hand in-flight tiles back within the grace period."""
        cancels = await self.rt.nc.subscribe(
            self.rt.names.event_filter(n.EventKind.JOB_CANCELLED), cb=self._on_cancel
        )
        announcer = asyncio.create_task(self.presence.run(stop), name="presence")
        try:
            await consume(
                self.rt.js,
                stream=self.rt.names.stream(n.STREAM_TILES),
                durable=n.CONSUMER_WORKERS,
                handler=self.handle,
                in_hand=self.in_hand,
                stop=stop,
                log=self.log,
                grace=self.rt.settings.process.grace_period,
                on_stop=self.handing_back.set,
            )
        finally:
            stop.set()  # also when consume failed: the announcer deletes the key and ends
            await announcer
            await cancels.unsubscribe()
            self.kernels.executor.shutdown(wait=False, cancel_futures=True)

    async def _on_cancel(self, msg: Msg) -> None:
        # The subject's job token is enough; the event body is for watchers.
        job_id = msg.subject.split(".")[-2]
        self.cancelled[job_id] = None
        while len(self.cancelled) > self._cancel_memory:
            self.cancelled.popitem(last=False)

    async def handle(self, msg: Msg) -> None:
        """One delivery."""
        self.current[id(msg)] = msg.subject
        try:
            await TileRun(self.context, Delivery.of(self.rt, msg)).run()
        finally:
            self.current.pop(id(msg), None)

    def _current_tiles(self) -> list[list[object]]:
        """``[job_id, tile_index]`` of the messages in hand."""
        pairs: list[tuple[str, int]] = []
        for subject in list(self.current.values()):
            job_id = n.job_of_tile_subject(subject)
            if job_id is not None:
                pairs.append((job_id, int(subject.rsplit(".", 1)[1])))
        return [[job_id, index] for job_id, index in sorted(pairs)]

    async def job(self, job_id: str) -> Job | None:
        """The job row, from the worker's cache (:class:`~services.worker.context.JobCache`)."""
        return await self.jobs.get(job_id)
