"""The worker process: tiles in hand from the consumers of its renderers, on kernel threads.

At start the worker finds its renderers (:func:`services.worker.renderers.discovered`:
``tessera`` and, on ``PATH``, ``blender`` and ``povray``, limited by ``TESSERA_RENDERERS``) and
binds the TILES consumer of each (``workers`` for tessera, ``workers-<renderer>``), sharing its
tiles in hand among them: a tile reaches only a worker that has its renderer.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from nats.aio.msg import Msg

from proto import names as n
from proto.messages import TileMessage
from services.worker import renderers, run
from services.worker.context import (
    JobCache,
    NatsTileEvents,
    RunTurns,
    StopView,
    TileContext,
    Wakers,
)
from services.worker.kernels import KernelThreads
from services.worker.presence import Presence
from services.worker.renderers.tessera import TesseraKernel
from services.worker.room import RoomCount, RoomNudges
from services.worker.scenes import AssetSource, SceneCache
from shared.metadata import Job
from shared.service.consume import consume_many
from shared.service.runtime import Runtime
from shared.service.settle import Delivery

__all__ = ["CHANGE_EVENTS", "Worker"]

#: job events after which a worker's tiles of that job read the job's row at once
CHANGE_EVENTS = (n.EventKind.JOB_PAUSED, n.EventKind.JOB_FAILED, n.EventKind.JOB_DEAD_LETTERED)


class Worker:
    """Holds up to ``in_hand`` TILES messages and renders their passes on ``slots`` kernel
    threads."""

    def __init__(self, rt: Runtime, assets: AssetSource | None = None) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="worker")
        config = rt.settings.worker
        #: kernel threads
        self.slots = config.kernel_threads()
        #: the renderers this worker runs, by name
        self.renderers = renderers.create_all(renderers.discovered(config.renderers), self.slots)
        tessera = self.renderers.get(renderers.TESSERA)
        #: the numba kernel's threads (idle in a worker told not to run it)
        self.kernels = tessera.threads if isinstance(tessera, TesseraKernel) else KernelThreads(1)
        # Tiles in hand: by default twice the kernel threads, so while one tile of a thread does
        # its I/O (result write, fenced commit, tile-done, release, ack; then fetch, lease,
        # fence the next) the other's passes keep the core busy. Passes of the tiles in hand
        # share the threads; of messages carrying runs, one per thread and one more are
        # started at a time, a new one once those have as few tiles left to render, and the
        # others wait in hand (RunTurns).
        self.in_hand = config.tiles_in_hand()
        # ``assets``: the worker's AssetCache, for scenes that are asset references (held while
        # a tile renders them)
        self.scenes = SceneCache(config.scene_cache, config.scene_cache_bytes, assets)
        self._cancel_memory = config.cancel_memory
        self.handing_back = asyncio.Event()
        #: jobs announced cancelled (job-cancelled events); bounded, oldest forgotten first
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        #: jobs announced paused, failed or dead-lettered: when (a hint to read their row)
        self.changed: OrderedDict[str, float] = OrderedDict()
        #: tile runs waiting mid-pass for news of their job
        self.wakers = Wakers()
        self.jobs = JobCache(rt.db, config.job_cache)
        #: the tiles of the TILES messages in hand, once decoded (``tessera top`` shows them)
        self.current: dict[int, TileMessage] = {}
        #: the dispatchers' nudge: a ``Room`` every few tiles that leave the hand
        self.room = RoomNudges(
            rt.nc, rt.names.room_subject, RoomCount(threads=self.slots, in_hand=self.in_hand),
            self.log,
        )  # fmt: skip
        self.presence = Presence(
            rt,
            threads=self.slots,
            in_hand=self.in_hand,
            current=self._current_tiles,
            renderers={name: r.version for name, r in self.renderers.items()},
        )
        self.context = TileContext(
            db=rt.db,
            leases=rt.leases,
            progress=rt.progress,
            store=rt.store,
            events=NatsTileEvents(rt, self.log),
            jobs=self.jobs,
            scenes=self.scenes,
            renderers=self.renderers,
            stop=StopView(self.handing_back, self.cancelled, self.changed, self.wakers),
            metrics=rt.metrics,
            lease_config=rt.settings.leases,
            worker_config=config,
            retry=rt.retry,
            node=rt.node,
            log=self.log,
            turns=RunTurns(self.slots + 1, lead=self.slots + 1),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop``; then hand in-flight tiles back within the grace period."""
        cancels = await self.rt.nc.subscribe(
            self.rt.names.event_filter(n.EventKind.JOB_CANCELLED), cb=self._on_cancel
        )
        self.log.info("renderers", **{r.name: r.version for r in self.renderers.values()})
        changes = [
            await self.rt.nc.subscribe(self.rt.names.event_filter(kind), cb=self._on_change)
            for kind in CHANGE_EVENTS
        ]
        announcer = asyncio.create_task(self.presence.run(stop), name="presence")
        try:
            await consume_many(
                self.rt.js,
                stream=self.rt.names.stream(n.STREAM_TILES),
                durables=[n.workers_consumer(name) for name in self.renderers],
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
            for sub in changes:
                await sub.unsubscribe()
            for renderer in self.renderers.values():
                await renderer.close()

    async def _on_cancel(self, msg: Msg) -> None:
        # The subject's job token is enough; the event body is for watchers.
        job_id = msg.subject.split(".")[-2]
        self.cancelled[job_id] = None
        while len(self.cancelled) > self._cancel_memory:
            self.cancelled.popitem(last=False)
        self.wakers.wake(job_id)  # a pass of its tiles in progress stops now

    async def _on_change(self, msg: Msg) -> None:
        # Only a hint: the tiles of the job read its row now (mid-pass if the pass can be
        # interrupted, else at their next pass boundary).
        job_id = msg.subject.split(".")[-2]
        self.changed[job_id] = time.monotonic()
        self.changed.move_to_end(job_id)
        while len(self.changed) > self._cancel_memory:
            self.changed.popitem(last=False)
        self.wakers.wake(job_id)  # a pass in progress reads the row now, not at its end

    async def handle(self, msg: Msg) -> None:
        """One delivery."""

        def holding(message: TileMessage) -> None:
            self.current[id(msg)] = message

        try:
            await run.handle(self.context, Delivery.of(self.rt, msg), holding)
        finally:
            message = self.current.pop(id(msg), None)
            held = sum(len(m.tiles) for m in list(self.current.values()))
            try:
                await self.room.left(len(message.tiles) if message is not None else 1, held)
            except Exception:  # a hint: never in place of the handler's own outcome or error
                self.log.error("room message failed", exc=True)

    def _current_tiles(self) -> list[list[object]]:
        """``[job_id, tile_index]`` of the messages in hand."""
        pairs = [(m.job_id, i) for m in list(self.current.values()) for i in m.tiles]
        return [[job_id, index] for job_id, index in sorted(pairs)]

    async def job(self, job_id: str) -> Job | None:
        """The job row, from the worker's cache (:class:`~services.worker.context.JobCache`)."""
        return await self.jobs.get(job_id)
