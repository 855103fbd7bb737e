"""The sweeper: re-publish tiles whose message was lost.

The broker is not the source of truth (see docs/architecture.md): a stale owner's late ack can
acknowledge a redelivered message, and acks can be lost in a leader election, so a tile can be not
done while no message for it exists. Every ``TESSERA_SWEEP_INTERVAL`` the sweeper takes a
**snapshot**: up to ``TESSERA_SWEEP_BATCH`` tiles (the next page of them after the previous pass's,
wrapping to the oldest after a short page) of dispatchable jobs that are released (``published_at``
set), not done and were last published more than ``TESSERA_SWEEP_AGE`` ago. An unreleased tile is
waiting for the dispatcher by design and is never a candidate; a released one with no message (a
dispatcher killed between its release and its publishes) is swept like a lost one. For those it
asks the broker, in bulk, which have a message in the TILES stream (one subject listing per job)
and which a live lease (one listing of the job's lease keys, then a read of only the listed keys
that have no message). The rest are **claimed** in one
PostgreSQL statement that re-checks each tile against its snapshot row (still not done, job still
live, row unchanged: no fence, progress, commit or publish since) and moves it to the next
generation; only the claimed tiles are re-published, under the new generation in their
``Nats-Msg-Id`` (the old id may still sit in the duplicate window).

Each sweep also looks for **lost completions**: jobs whose every tile has been done for more
than ``TESSERA_SWEEP_AGE`` while no finalizer took them (still running, progressing or paused).
The worker whose commit completes a job announces it with a tiles-done event; were that event
lost (a stream purged, a deployment upgraded while the finalizer consumer still held tile-done
events), nothing else would finalize the job. When the finalizer consumer has nothing pending
or in delivery (so the finalizers are not simply behind, and at most one copy per job waits),
the sweeper publishes a tiles-done event for each, under a fresh id.

Everything the claim acts on was observed after the snapshot and within
:attr:`Sweeper.max_snapshot_age` of it; a pass that took longer (a leader election stalling the
reads) drops its observations and starts over from a fresh snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterable

from nats.js import api
from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from proto.messages import JobMessage
from shared.core.errors import RetryableError
from shared.core.pauses import pause_point
from shared.metadata import Tile
from shared.metadata.tiles import StaleKey, stale_key
from shared.nats.jetstream import publish, retry_transient, subjects_with_messages
from shared.service.announce import announce_completion
from shared.service.publish import publish_tiles
from shared.service.runtime import Runtime

__all__ = ["SNAPSHOT_MAX_AGE", "Sweeper"]

READ_TIMEOUT = 15.0
"""Bound on one stream read: longer than a leader election (a few seconds, NATS-NOTES)."""
SNAPSHOT_MAX_AGE = 5.0
"""Seconds from the snapshot to the claim past which a pass starts over (a normal pass over
1,000 tiles takes a few tens of milliseconds; a slow one is riding out a leader election)."""
SNAPSHOT_ROUNDS = 2
"""Snapshots one sweep takes at most before leaving the rest to the next sweep."""
_JOB_READS = 16
"""Jobs whose subjects are listed at once."""


class Sweeper:
    """Finds and re-publishes lost tiles."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.log = rt.log.bind(component="sweeper")
        self.stream = rt.names.stream(n.STREAM_TILES)
        self.max_snapshot_age = SNAPSHOT_MAX_AGE
        #: stale tiles one sweep pass looks at (oldest publish first, ``TESSERA_SWEEP_BATCH``).
        #: A backlog of more stale tiles (a large job queued longer than the sweep age) is paged
        #: through, pass after pass, so a lost tile behind a thousand queued ones is still found.
        self.snapshot_limit = rt.settings.sweeper.batch
        self._cursor: StaleKey | None = None  # where the next snapshot starts in stale order

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``TESSERA_SWEEP_INTERVAL`` until ``stop``."""
        interval = self.rt.settings.sweeper.interval
        while not stop.is_set():
            try:
                await self.sweep_once()
            except RetryableError as exc:
                self.log.warning("sweep failed; next round will retry", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def sweep_once(self) -> list[Tile]:
        """One sweep; returns the tiles it re-published, at their new generation (lost jobs
        are re-published too)."""
        age = self.rt.settings.sweeper.age
        await self._republish_lost_jobs(age)
        await self._announce_lost_completions(age)
        loop = asyncio.get_running_loop()
        for _ in range(SNAPSHOT_ROUNDS):
            taken = loop.time()
            after = self._cursor
            stale = await self.rt.db.stale_tiles(
                older_than=age, limit=self.snapshot_limit, after=after
            )
            # A full page: the next pass goes on after it; a short one: back to the oldest.
            self._cursor = stale_key(stale[-1]) if len(stale) >= self.snapshot_limit else None
            if not stale:
                if after is None:
                    return []
                continue  # the last page ended exactly at the limit: start from the oldest
            await pause_point("sweeper.after_snapshot")
            unaccounted = await self._unaccounted(stale)
            await pause_point("sweeper.before_claim")
            elapsed = loop.time() - taken
            if elapsed > self.max_snapshot_age:
                self._cursor = after  # the fresh snapshot looks at the same page again
                self._skipped("expired", len(unaccounted))
                self.log.warning(
                    "sweep pass outlived its snapshot; starting over",
                    seconds=round(elapsed, 3),
                    stale=len(stale),
                )
                continue
            return await self._republish(unaccounted, age)
        return []

    async def _republish(self, unaccounted: list[Tile], age: float) -> list[Tile]:
        """Claim ``unaccounted`` (the atomic re-check) and publish what was claimed."""
        claimed = await self.rt.db.claim_lost_tiles(unaccounted, older_than=age)
        self._skipped("changed", len(unaccounted) - len(claimed))
        if claimed:
            await publish_tiles(self.rt, claimed)
            self.rt.metrics.republished.inc(len(claimed))
        for t in claimed:
            self.log.warning(
                "re-published lost tile",
                job_id=t.job_id,
                tile=t.tile_index,
                generation=t.generation,
            )
        return claimed

    async def _unaccounted(self, stale: list[Tile]) -> list[Tile]:
        """The tiles of ``stale`` with no message in TILES and no live lease (asked per job)."""
        by_job: dict[str, list[Tile]] = {}
        for t in stale:
            by_job.setdefault(t.job_id, []).append(t)
        gate = asyncio.Semaphore(_JOB_READS)
        reasons: Counter[str] = Counter()

        async def of_job(job_id: str, tiles: list[Tile]) -> list[Tile]:
            async with gate:
                queued = await self._with_message(job_id, tiles)
                reasons["message"] += len(queued)
                rest = [t for t in tiles if t.tile_index not in queued]
                if not rest:
                    return []
                keys = {n.lease_key_tile(job_id, t.tile_index): t for t in rest}
                held = await self.rt.leases.held(keys, scan=n.lease_keys_of_job(job_id))
                reasons["lease"] += len(held)
                return [t for k, t in keys.items() if k not in held]

        found = await asyncio.gather(*(of_job(j, ts) for j, ts in by_job.items()))
        for reason, count in reasons.items():
            self._skipped(reason, count)
        return [t for tiles in found for t in tiles]

    async def _with_message(self, job_id: str, tiles: Iterable[Tile]) -> set[int]:
        """Indexes among ``tiles`` with a message in TILES (pending or in delivery)."""
        names = self.rt.names
        listed = await subjects_with_messages(
            self.rt.js, self.stream, names.tile_subjects_of(job_id), timeout_total=READ_TIMEOUT
        )
        if listed is not None:
            # (a run's message names its tiles: ``<first>-<last>``)
            listed_tiles = filter(None, map(n.tiles_of_subject, listed))
            indexes = {i for (j, run) in listed_tiles if j == job_id for i in run}
            return {t.tile_index for t in tiles if t.tile_index in indexes}
        # The listing was cut short (a huge backlog): ask per tile. (A tile that went out in a
        # run has no subject of its own: it looks lost and is re-published alone, under the next
        # generation, which makes the run's copy of it superseded — a publish more, no loss.)
        gate = asyncio.Semaphore(_JOB_READS)
        job = await self.rt.db.get_job(job_id)
        renderer = n.RENDERER_TESSERA if job is None else job.renderer

        async def queued(t: Tile) -> int | None:
            async with gate:
                subject = names.tile_subject(job_id, t.tile_index, renderer)
                found = await self._in_stream(self.stream, subject)
            return t.tile_index if found else None

        return {i for i in await asyncio.gather(*(queued(t) for t in tiles)) if i is not None}

    def _skipped(self, reason: str, count: int) -> None:
        if count > 0:
            self.rt.metrics.sweeper_skipped.labels(reason=reason).inc(count)

    async def _republish_lost_jobs(self, age: float) -> None:
        """Re-publish the JOBS message of jobs that sat queued and unplanned for ``age`` s.

        Only when no message for the job is in JOBS; the copy gets a fresh id, since the lost
        one's may still be in the duplicate window. A planner given a copy of a planned job
        finds the plan and stops.
        """
        jobs_stream = self.rt.names.stream(n.STREAM_JOBS)
        for job in await self.rt.db.stale_queued_jobs(older_than=age):
            if await self._in_stream(jobs_stream, self.rt.names.job_subject(job.job_id)):
                continue  # waiting for the planner, not lost
            await publish(
                self.rt.js,
                self.rt.names.job_subject(job.job_id),
                JobMessage(job.job_id, job.generation),
                msg_id=n.swept_job_msg_id(job.job_id, job.generation, int(time.time())),
            )
            self.log.warning("re-published a lost job", job_id=job.job_id)

    async def _announce_lost_completions(self, age: float) -> list[str]:
        """Publish a tiles-done event for each job complete for ``age`` s that no finalizer
        took, when the finalizer consumer has nothing pending; the jobs announced."""
        lost = await self.rt.db.unfinalized_jobs(older_than=age)
        if not lost:
            return []
        events = self.rt.names.stream(n.STREAM_EVENTS)

        async def attempt(budget: float) -> api.ConsumerInfo:
            return await asyncio.wait_for(
                self.rt.js.consumer_info(events, n.CONSUMER_FINALIZER), budget
            )

        info = await retry_transient("finalizer consumer info", attempt, timeout_total=READ_TIMEOUT)
        if info.num_pending or info.num_ack_pending:
            return []  # the finalizers have events to take first: the job's may be among them
        stamp = int(time.time())
        for job_id, completion in lost:
            await announce_completion(self.rt, job_id, completion, id_suffix=f":swept{stamp}")
            self.log.warning("announced a lost completion", job_id=job_id, completion=completion)
        return [job_id for job_id, _ in lost]

    async def _in_stream(self, stream: str, subject: str) -> bool:
        """True if a message on ``subject`` is still in ``stream`` (pending or in delivery)."""

        async def attempt(budget: float) -> object:
            return await asyncio.wait_for(self.rt.js.get_last_msg(stream, subject), budget)

        try:  # a leader election answers 503 or nothing for seconds: retry, bounded
            await retry_transient(f"read {stream}", attempt, timeout_total=READ_TIMEOUT)
        except StreamMsgNotFound:
            return False
        return True
