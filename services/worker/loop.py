"""The worker process: tiles in hand from the shared ``workers`` consumer, on kernel threads."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from nats.aio.msg import Msg

from proto import names as n
from proto.messages import JobEvent
from services.announce import announce
from services.consume import consume
from services.worker.kernels import KernelThreads
from services.worker.scenes import SceneCache
from services.worker.tile import TileRun
from shared.errors import TesseraError
from shared.lifecycle import IllegalTransition, JobTrigger, is_terminal
from shared.metadata import Job
from shared.runtime import Runtime

__all__ = ["Worker"]

_EVENT_FOR = {
    JobTrigger.TERMINAL_FAILURE: n.EventKind.JOB_FAILED,
    JobTrigger.DEAD_LETTER: n.EventKind.JOB_DEAD_LETTERED,
}


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
        self._job_cache = config.job_cache
        self._cancel_memory = config.cancel_memory
        self.handing_back = asyncio.Event()
        #: jobs announced cancelled (job-cancelled events); bounded, oldest forgotten first
        self.cancelled: OrderedDict[str, None] = OrderedDict()
        self._jobs: OrderedDict[str, Job] = OrderedDict()

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
                in_hand=self.in_hand,
                stop=stop,
                log=self.log,
                grace=self.rt.settings.process.grace_period,
                on_stop=self.handing_back.set,
            )
        finally:
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
        await TileRun(self, msg).run()

    async def job(self, job_id: str) -> Job | None:
        """The job row, cached: what tiles need of it (scene, settings, input hash) never
        changes. Its state may be stale; the fence checks the live state."""
        job = self._jobs.get(job_id)
        if job is None or is_terminal(job.state) or job.cancel_requested:
            job = await self.rt.db.get_job(job_id)
            if job is None:
                return None
        self._jobs[job_id] = job
        self._jobs.move_to_end(job_id)
        while len(self._jobs) > self._job_cache:
            self._jobs.popitem(last=False)
        return job

    async def fail_job(self, job_id: str, trigger: JobTrigger, exc: TesseraError) -> None:
        """Move the job to a failed state (if still legal) and tell watchers."""
        try:
            job = await self.rt.db.transition_job(
                job_id, trigger, node=self.rt.node, error_code=exc.code, error=str(exc)
            )
        except IllegalTransition:
            return
        self.log.warning("job failed", job_id=job_id, to=job.state.value, code=exc.code)
        kind = _EVENT_FOR[trigger]
        await announce(self.rt, JobEvent(job_id, kind, job.generation, str(exc)[:4000]))
