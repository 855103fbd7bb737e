"""One delivery of one tile, step by step (DESIGN.md "Worker flow").

1. decode; look up the job (cached) — unknown, terminal or cancel-requested job: ack;
2. lease (held by a live owner: read the tile — done: (re)announce, ack; else ``nak`` with a
   delay, never work in parallel);
3. fence the tile row with the lease's acquire revision and record the attempt — for a tile
   never leased, one statement that also returns the row; a row that says done (re-announce),
   final or superseded by a newer generation settles the copy (ack) with nothing written;
   any other case (retry, takeover, the job's first tile) goes through the transaction;
4. resume from the progress pointer only if its ``input_hash`` matches;
5. render in passes off the loop; checkpoint every ``checkpoint_interval``; check cancel and the
   lease between passes — the render ends :class:`Finished` or :class:`Stopped` (a
   :class:`~services.worker.context.StopReason`);
6. write the result (content-addressed), commit it **fenced** (a tile of a run: together with
   the run's other tiles, once none of them is still rendering: :class:`RunCommits`);
7. publish tile-done (and tiles-done if this commit completed the job), clean up, leave the
   lease to its TTL, **then ack**.

Every step ends in a typed outcome (:mod:`shared.service.settle`) and :meth:`TileRun.run` settles
the message once: success → ack, retryable → ``nak(delay)``, terminal → DLQ copy + ``term()``, lease
lost or fenced → nothing (the new owner holds the message's fate), hand-back on shutdown →
checkpoint + ``nak``. The run is handed a :class:`~services.worker.context.TileContext` by its
worker and never calls back into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import replace

from proto import names as n
from proto.messages import TileDone, TileMessage, TilesDone
from services.worker.checkpoints import Checkpoints
from services.worker.context import RunCommits, StopReason, TileContext
from services.worker.render import Finished, Render, Stopped, pass_size
from shared.core import crash
from shared.core.errors import (
    DecodeError,
    RetryableError,
    TerminalError,
    TesseraError,
    with_detail,
)
from shared.core.lifecycle import IllegalTransition, JobState, TileState, TileTrigger, is_terminal
from shared.core.tiles import Accumulator, to_npy
from shared.metadata import AttemptOutcome, CommitOutcome, FirstFence, Job, Tile, TileCommit
from shared.nats.leases import Lease, LeaseOwner
from shared.objectstore import tile_result_key
from shared.service.heartbeat import Heartbeat
from shared.service.settle import (
    ACK,
    ACK_RECORDED,
    HAND_BACK,
    Ack,
    DeadLetter,
    Delivery,
    Leave,
    Outcome,
    Retry,
    outcome_of,
    settle,
)

__all__ = ["TileRun", "pass_size"]


#: error code and message of an attempt cut short by the end of the drain's grace period
_CUT = "grace_expired", "the worker stopped before the attempt ended (drain grace period over)"


class TileRun:
    """Processes one TILES delivery."""

    def __init__(
        self,
        ctx: TileContext,
        delivery: Delivery,
        message: TileMessage | None = None,
        commits: RunCommits | None = None,
    ) -> None:
        self.ctx = ctx
        self.delivery = delivery
        #: the tile, when the caller decoded it (one tile of a run); else the body is decoded
        self.message = message
        #: the run's commits this tile's commit goes with (a tile of a run)
        self.commits = commits
        self.attempt_id = n.new_attempt_id()
        self.log = ctx.log.bind(attempt_id=self.attempt_id)
        self.token: int | None = None  # our fencing token once the tile row is fenced
        self.started = time.monotonic()  # reset when the tile row is fenced
        self.released = False
        self.resumed_from = 0  # samples per pixel the attempt resumed from
        self.committed: int | None = None  # samples of this attempt's own commit, once it landed
        #: job and heartbeat ``lost`` under which this run owns its tile in ``ctx.questions``
        #: (fenced, not committed, not let go)
        self.owning: tuple[str, asyncio.Event] | None = None
        #: this run's commit did not ask the completion question: another run of its job
        #: owned an unfinished tile here (Questions)
        self.deferred = False

    async def run(self) -> None:
        """Process the delivery and settle the message exactly once."""
        outcome = await self.outcome()
        await settle(self.delivery, outcome)
        if self.deferred and isinstance(outcome, Ack):
            crash.crash_point("worker.after_deferred_ack")
        self.settled()

    def settled(self) -> None:
        """Count and log a tile this run committed, once its message is settled."""
        if self.committed is not None:  # counted once acked, as a tile of this worker
            self.ctx.metrics.tiles_completed.inc()
            self.ctx.metrics.tile_seconds.observe(time.monotonic() - self.started)
            self.log.info("tile done", samples=self.committed, resumed_from=self.resumed_from,
                          token=self.token)  # fmt: skip

    async def outcome(self) -> Outcome:
        """Every step up to the settle: what to do with the message."""
        if self.message is not None:
            tm = self.message
        else:
            try:
                tm = TileMessage.decode(self.delivery.data)
            except DecodeError as exc:
                # the body is garbage, but its subject still names the job
                job_id = n.job_of_tile_subject(self.delivery.subject)
                return DeadLetter(job_id, n.DLQ_UNIT_JOB, exc)
        if tm.run != 1:
            # One tile per TileRun: settling a run's message for its first tile would drop the
            # rest (services.worker.run.handle splits a run). A bug, so like one: nothing is
            # settled and the message comes back after ack_wait.
            raise TypeError(
                f"TileRun got a run of {tm.run} tiles ({tm.job_id} from tile {tm.tile_index}); "
                "services.worker.run.handle splits runs"
            )
        self.log = self.log.bind(job_id=tm.job_id, tile=tm.tile_index)
        try:
            return await self._process(tm)
        except (RetryableError, TerminalError) as exc:
            return await self._failed(tm, exc)
        except Exception as exc:  # a bug: consume logs it; the message comes back after ack_wait
            with contextlib.suppress(Exception):
                await self._end_attempt(AttemptOutcome.RETRYABLE, TesseraError.code, repr(exc))
            raise
        finally:
            self._disown()

    def _own(self, job_id: str, beat: Heartbeat) -> None:
        self.ctx.questions.own(job_id, beat.lost)
        self.owning = (job_id, beat.lost)

    def _disown(self) -> None:
        if self.owning is not None:
            self.ctx.questions.disown(*self.owning)
            self.owning = None

    # ------------------------------------------------------------------ steps 1-3

    async def _process(self, tm: TileMessage) -> Outcome:
        job = await self.ctx.jobs.get(tm.job_id)
        if job is None:
            self.log.warning("tile message for an unknown job; dropping")
            return ACK
        gated = self._gate(job)
        if gated is not None:
            return gated
        crash.crash_point("worker.before_lease")
        owner = LeaseOwner(node=self.ctx.node, attempt_id=self.attempt_id)
        lease = await self.ctx.leases.acquire(n.lease_key_tile(tm.job_id, tm.tile_index), owner)
        if lease is None:
            return await self._held(tm, job)
        interval = self.ctx.lease_config.heartbeat_interval
        beat = Heartbeat(self.ctx.leases, lease, self.delivery, interval, self.log).start()
        try:
            return await self._fence(tm, job, beat)
        finally:
            # Even after LeaseLost: a renew buffered while disconnected may still land, and a
            # release of a lease that is no longer ours is refused harmlessly.
            await self._release(await beat.stop())
            if beat.lost.is_set():
                self.ctx.metrics.lease_renewal_failures.labels(kind="tile").inc()

    def _gate(self, job: Job) -> Outcome | None:
        """The outcome of a message whose job alone says there is nothing to render here.

        The job row may come from the worker's cache, so its state can be stale, but a terminal,
        paused or cancel-requested row is always read afresh (:class:`JobCache`); the fence
        re-checks the job's state and cancel flag in the statement that takes the tile.
        """
        if is_terminal(job.state) or job.cancel_requested:
            self.log.info("job is final; dropping", state=job.state.value)
            return ACK
        if job.renderer not in self.ctx.renderers:
            # Routing sends a worker only the tiles of its renderers; a copy that reached it
            # anyway (a consumer of an older topology) goes back for a worker that has it.
            self.log.warning("tile of a renderer this worker lacks; handing back",
                             renderer=job.renderer)  # fmt: skip
            return Retry(float(self.ctx.lease_config.ttl))
        return None

    async def _held(self, tm: TileMessage, job: Job) -> Outcome:
        """The lease is held by another owner: the tile row says what this copy is for."""
        settled = await self._settled(tm, job, await self.ctx.db.get_tile(tm.job_id, tm.tile_index))
        if settled is not None:
            return settled
        if job.state is JobState.PAUSED:
            # its live owner stops at its next pass and hands the tile back itself
            self.log.info("paused job's tile held by its owner; dropping this copy")
            return ACK
        self.log.info("lease held by another owner; backing off")
        return Retry(float(self.ctx.lease_config.ttl))

    async def _settled(self, tm: TileMessage, job: Job, tile: Tile | None) -> Outcome | None:
        """The outcome of a copy whose tile row (as just read) leaves nothing to render, else
        ``None``: a done tile is (re)announced, a final or superseded one dropped."""
        if tile is None:
            self.log.warning("tile message for an unknown tile; dropping")
        elif tile.state is TileState.DONE:
            await self._announce(job, tile.tile_index, tile.result_key, tile.lease_fence)
            self.log.info("tile already done")
        elif is_terminal(tile.state):
            self.log.info("tile is final; dropping", state=tile.state.value)
        elif tm.generation < tile.generation:
            # A later release or sweep published the tile again under a newer generation:
            # that message is the tile's now (the dispatcher counted it in its window).
            self.log.info("superseded tile message; dropping", generation=tm.generation,
                          current=tile.generation)  # fmt: skip
            self.ctx.metrics.superseded.inc()
        else:
            return None
        return ACK

    async def _fence(self, tm: TileMessage, job: Job, beat: Heartbeat) -> Outcome:
        """Lease held: fence the tile, or settle the copy by what its row says.

        The plain case (a tile never leased, of a job that TILE_STARTED leaves as it is) is one
        statement that fences and reads at once; its row, fenced or not, decides the rest.
        """
        if job.state is JobState.PAUSED:
            tile = await self.ctx.db.get_tile(job.job_id, tm.tile_index)
            settled = await self._settled(tm, job, tile)
            if settled is not None or tile is None:
                return settled or ACK
            return await self._unrelease(job, tile, beat)
        first = await self._fence_first(job.job_id, tm.tile_index, beat.lease.token, tm.generation)
        settled = None if first.fenced else await self._settled(tm, job, first.tile)
        if settled is not None or first.tile is None:
            # the lease this copy took is given back on the way out (it changed nothing)
            crash.crash_point("worker.before_copy_release")
            return settled or ACK
        return await self._leased(job, first.tile, beat, fenced=first.fenced,
                                  generation=tm.generation)  # fmt: skip

    async def _leased(
        self, job: Job, tile: Tile, beat: Heartbeat, *, fenced: bool, generation: int
    ) -> Outcome:
        """Render under the lease; ``fenced``: :meth:`fence_first` fenced it already, else the
        transaction fences it here (after loading the checkpoint, so the attempt records the
        resume that happens; one job at a time in this worker, :meth:`_fence_in_turn`)."""
        token = beat.lease.token
        renderer = self.ctx.renderers[job.renderer]  # (checked by _gate)
        checkpoints = Checkpoints(self.ctx, job, tile, self.attempt_id, self.log, renderer)
        acc = await checkpoints.resume()  # (a never-leased tile: zeros, nothing read)
        self.resumed_from = checkpoints.resumed_from
        if not fenced:
            fenced = await self._fence_in_turn(job, tile, token, generation)
        if not fenced:
            if (await self.ctx.db.job_control(job.job_id)).state is JobState.PAUSED:
                # A paused job refuses TILE_STARTED: hand the tile back, never drop it.
                return await self._unrelease(job, tile, beat)
            self.log.info("fence refused: tile done or taken by a newer owner")
            await self._release(await beat.stop())
            return ACK
        self.token = token
        self._own(job.job_id, beat)
        self._acquired(tile, token)
        crash.crash_point("worker.after_lease")
        if self.resumed_from:
            self.ctx.metrics.resumes.inc()
            self.log.info("resumed from checkpoint", samples=self.resumed_from)
        with self.ctx.metrics.tiles_in_flight.track_inprogress():
            try:
                return await self._render_and_commit(job, tile, acc, checkpoints, beat)
            except asyncio.CancelledError:
                # The drain's grace period ran out (or the loop is going away) mid-attempt:
                # the message is redelivered after ack_wait; say so in the attempt row.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._end_attempt(AttemptOutcome.HANDED_BACK, *_CUT))
                raise

    async def _fence_first(
        self, job_id: str, tile_index: int, token: int, generation: int
    ) -> FirstFence:
        """The plain fence statement for this attempt (:meth:`TileStore.fence_first`)."""
        return await self.ctx.db.fence_first(job_id, tile_index, token=token,
                                             attempt_id=self.attempt_id, node=self.ctx.node,
                                             generation=generation)  # fmt: skip

    async def _fence_in_turn(self, job: Job, tile: Tile, token: int, generation: int) -> bool:
        """The fence's transaction, in the job's turn (:class:`~services.worker.context.JobMoves`):
        a tile run that waited for another's asks the plain statement again first (that one
        has moved the job, as a rule), unless it resumes a checkpoint (never the plain case)."""
        async with self.ctx.moves.turn(job.job_id) as waited:
            if waited and not self.resumed_from:
                again = await self._fence_first(job.job_id, tile.tile_index, token, generation)
                if again.fenced:
                    return True
            return await self.ctx.db.fence_tile(
                job.job_id,
                tile.tile_index,
                token=token,
                attempt_id=self.attempt_id,
                node=self.ctx.node,
                resumed_from=self.resumed_from,
            )

    async def _render_and_commit(
        self, job: Job, tile: Tile, acc: Accumulator, cp: Checkpoints, beat: Heartbeat
    ) -> Outcome:
        renderer = self.ctx.renderers[job.renderer]
        ended = await Render(self.ctx, job, tile, beat, self.log, renderer).run(acc, cp)
        if isinstance(ended, Finished):
            committed = await self._commit(job, tile, acc, cp, beat, ended.render_seconds)
            if not isinstance(committed, Stopped):
                return committed
            ended = committed
        return await self._stopped(job, tile, acc, cp, beat, ended)

    def _acquired(self, tile: Tile, token: int) -> None:
        """Log and count a fenced acquire; a row still leased means a takeover."""
        self.started = time.monotonic()
        m = self.ctx.metrics
        m.tile_attempts.inc()
        if tile.lease_fence > 0 and tile.state in (TileState.LEASED, TileState.PROGRESSING):
            m.lease_takeovers.inc()
            self.log.warning("lease taken over", token=token, previous_fence=tile.lease_fence)
        else:
            # (DEBUG: one line per tile is "tile done", which names the token)
            self.log.debug("lease acquired", token=token)

    # ------------------------------------------------------------------ steps 6-7

    async def _commit(
        self,
        job: Job,
        tile: Tile,
        acc: Accumulator,
        cp: Checkpoints,
        beat: Heartbeat,
        render_seconds: float,
    ) -> Outcome | Stopped:
        data = to_npy(acc)
        sha = _sha256(data)
        inline = len(data) <= self.ctx.worker_config.inline_result_bytes
        key = None if inline else tile_result_key(job.job_id, tile.tile_index, sha)
        # Not fsynced: a result an OS crash loses fails its sha256 at finalization and is
        # rendered again (docs/architecture.md, "Worker flow" step 6).
        if self.commits is not None:  # with the run's other tiles, once none still renders
            await self.commits.rendered(tile.tile_index, None if key is None else (key, data, sha))
        elif key is not None:
            await self.ctx.store.put(key, data, durable=False, sha256=sha)
        crash.crash_point("worker.after_result_write")
        if beat.lost.is_set():
            return Stopped(StopReason.LEASE_LOST, job.spp)  # like a loss between passes
        done = TileCommit(
            job.job_id,
            tile.tile_index,
            token=beat.lease.token,
            attempt_id=self.attempt_id,
            result_key=key,
            result_sha256=sha,
            result_data=data if inline else None,
            samples_done=job.spp,
            node=self.ctx.node,
            render_seconds=render_seconds,
        )
        outcome = await self.ctx.db.commit_tile(done)
        if outcome is not CommitOutcome.COMMITTED:
            return await self._refused(job, tile, cp, beat, outcome)
        crash.crash_point("worker.after_commit")
        await self._announce(job, tile.tile_index, key, beat.lease.token)
        await cp.cleanup()  # (the commit closed the attempt as done)
        await self._keep_until_expiry(beat)
        crash.crash_point("worker.before_ack")
        self.committed = job.spp
        return ACK_RECORDED  # (the commit is the record: a lost ack redelivers a done tile)

    async def _refused(
        self, job: Job, tile: Tile, cp: Checkpoints, beat: Heartbeat, outcome: CommitOutcome
    ) -> Outcome:
        """The commit was refused (the store closed the attempt as ``fenced``): count it under
        its reason, never as a completed tile. Fenced: the newer owner holds the message's
        fate. Already done by another owner: announce their result and ack this copy."""
        self.ctx.metrics.commits_refused.labels(reason=outcome.value).inc()
        if outcome is CommitOutcome.FENCED:
            self.log.warning("commit refused by the fence: a newer owner has the tile")
            return Leave(StopReason.FENCED.value)
        current = await self.ctx.db.get_tile(job.job_id, tile.tile_index)
        fence = beat.lease.token if current is None else current.lease_fence
        self.log.warning(
            "commit refused: another owner committed the tile first", committed_by_fence=fence
        )
        if current is not None:
            await self._announce(job, tile.tile_index, current.result_key, fence)
        await cp.cleanup()
        await self._release(await beat.stop())
        return ACK

    async def _unrelease(self, job: Job, tile: Tile, beat: Heartbeat) -> Outcome:
        """A message of a paused job's tile, the lease ours but nothing rendered: hand the tile
        back unreleased (queued, ``published_at`` NULL), release, ack. If the job was resumed
        meanwhile, the message comes back at once and is rendered as usual."""
        crash.crash_point("worker.before_unrelease")
        token = beat.lease.token
        done = await self.ctx.db.unrelease_tile(
            job.job_id, tile.tile_index, token=token, node=self.ctx.node
        )
        await self._release(await beat.stop())
        if not done:
            self.log.info("paused job's tile not handed back (resumed, or moved on)")
            return Retry(0.0)
        self.log.info("paused job's tile handed back unreleased")
        return ACK

    async def _paused(
        self, job: Job, tile: Tile, acc: Accumulator, cp: Checkpoints, beat: Heartbeat, samples: int
    ) -> tuple[Outcome, StopReason]:
        """Stopped at a pass boundary by the job's pause: checkpoint now, hand the tile back
        unreleased (fenced), release, ack; the next attempt resumes from this checkpoint."""
        token = beat.lease.token
        if samples > cp.latest and not await cp.write(acc, samples, token):
            return Leave(StopReason.FENCED.value), StopReason.FENCED
        crash.crash_point("worker.after_pause_checkpoint")
        crash.crash_point("worker.before_unrelease")
        handed = await self.ctx.db.unrelease_tile(
            job.job_id, tile.tile_index, token=token, attempt_id=self.attempt_id,
            node=self.ctx.node,
        )  # fmt: skip
        if handed:
            await self._release(await beat.stop())
            return ACK, StopReason.PAUSED
        current = await self.ctx.db.get_tile(job.job_id, tile.tile_index)
        if current is None or current.lease_fence > token:
            return Leave(StopReason.FENCED.value), StopReason.FENCED
        # Resumed before the hand-back: the checkpoint stands; let the message come back.
        await self.ctx.db.end_attempt(self.attempt_id, outcome=AttemptOutcome.HANDED_BACK)
        await self._release(await beat.stop())
        return HAND_BACK, StopReason.HANDED_BACK

    async def _announce(
        self, job: Job, tile_index: int, result_key: str | None, fence: int
    ) -> None:
        # An inline result (no object) is announced with an empty key; the row names it.
        done = TileDone(job.job_id, tile_index, self.attempt_id, result_key or "", job.input_hash)
        await self.ctx.events.tile_done(done, fence)
        # Asked after the commit: of several commits that finish a job together, the last one
        # sees them all, so the job's completion is always announced (a crash before it leaves
        # the message unacked, and its redelivery finds the tile done and comes back here).
        # While another run of the job owns an unfinished tile here, the job is not complete
        # and that tile's commit, after this one, asks (Questions).
        self._disown()  # (this run's tile is done, by this commit or another owner's)
        if self.ctx.questions.defer(job.job_id):
            self.deferred = True
            return
        completion = await self.ctx.db.completed_by(job.job_id)
        if completion is not None:
            crash.crash_point("worker.before_tiles_done")
            await self.ctx.events.tiles_done(TilesDone(job.job_id, completion))

    async def _keep_until_expiry(self, beat: Heartbeat) -> None:
        """After our own commit: stop renewing, but leave the lease to its TTL.

        The fenced commit already refuses every later write under this token, and any later
        copy of the message finds the tile ``done`` before it asks for the lease, so a release
        would buy nothing but a KV write and a round trip per tile
        (docs/architecture.md, "Worker flow").
        """
        await beat.stop()
        self.released = True

    async def _release(self, lease: Lease) -> None:
        if self.released:
            return
        self.released = True
        try:
            await self.ctx.leases.release(lease)
        except RetryableError as exc:
            self.log.warning("lease release failed; it expires on its own", error=str(exc))

    # ------------------------------------------------------------------ outcomes

    async def _stopped(
        self, job: Job, tile: Tile, acc: Accumulator, cp: Checkpoints, beat: Heartbeat,
        stop: Stopped,
    ) -> Outcome:  # fmt: skip
        db, token, why = self.ctx.db, beat.lease.token, stop.reason
        outcome: Outcome = Leave(why.value)
        if why is StopReason.CANCELLED:
            await db.fail_tile(
                job.job_id, tile.tile_index, token=token, attempt_id=self.attempt_id,
                trigger=TileTrigger.CANCEL, error_code="cancelled", error="job cancelled",
                node=self.ctx.node, outcome="cancelled",
            )  # fmt: skip
            await cp.cleanup()
            await self._release(await beat.stop())
            outcome = ACK
        elif why is StopReason.PAUSED:
            outcome, why = await self._paused(job, tile, acc, cp, beat, stop.samples)
        elif why is StopReason.ENDED:
            control = await db.job_control(job.job_id)
            code = control.last_error_code or "job_failed"
            failed = await db.fail_tile(
                job.job_id, tile.tile_index, token=token, attempt_id=self.attempt_id,
                trigger=TileTrigger.TERMINAL_FAILURE, error_code=code,
                error=f"job {control.state.value} ({code})", node=self.ctx.node,
                outcome=AttemptOutcome.TERMINAL,
            )  # fmt: skip
            if failed is None:  # the fence is a newer owner's (the store closed our attempt)
                self.log.info("tile stopped", why=StopReason.FENCED.value, samples=stop.samples)
                return Leave(StopReason.FENCED.value)
            await self._release(await beat.stop())
            outcome = ACK
        elif why is StopReason.HANDED_BACK:
            if stop.samples > cp.resumed_from and not await cp.write(acc, stop.samples, token):
                why = StopReason.FENCED  # a newer owner has the tile: not ours to hand back
                outcome = Leave(why.value)
            else:
                await db.end_attempt(self.attempt_id, outcome="handed_back")
                await self._release(await beat.stop())
                outcome = HAND_BACK
        if isinstance(outcome, Leave):  # the tile is someone else's now; settle nothing
            await db.end_attempt(self.attempt_id, outcome=why.value, error_code=why.value)
        self.log.info("tile stopped", why=why.value, samples=stop.samples)
        return outcome

    async def _end_attempt(self, outcome: AttemptOutcome, code: str, error: str) -> None:
        """Close our attempt (if we fenced one) when no tile move records it; the first
        outcome wins, so an attempt already closed (``done``, ``fenced``) keeps its own."""
        if self.token is not None:
            await self.ctx.db.end_attempt(
                self.attempt_id, outcome=outcome, error_code=code, error=error
            )

    async def _failed(self, tm: TileMessage, exc: RetryableError | TerminalError) -> Outcome:
        """The outcome of a step that raised ``exc``, with the failure recorded."""
        outcome = outcome_of(exc, retry=self.ctx.retry, deliveries=self.delivery.deliveries,
                             job_id=tm.job_id, unit=n.dlq_unit_tile(tm.tile_index))  # fmt: skip
        if isinstance(exc, IllegalTransition):
            # A race with a state change elsewhere (a cancel, a finished job): nothing to redo.
            self.log.info("tile no longer applicable", error=str(exc))
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.FENCED, exc.code, str(exc))
        elif isinstance(outcome, Leave):
            self.log.warning("lease lost; leaving the tile to its new owner", error=str(exc))
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.LEASE_LOST, exc.code, str(exc))
        elif isinstance(outcome, Retry) and isinstance(exc, RetryableError):
            # (a renderer's crash by signal or timeout: its stderr tail goes with the attempt)
            await self._retryable(tm, exc, outcome.delay)
        elif isinstance(outcome, DeadLetter) and isinstance(exc, TerminalError):
            self.log.error("terminal failure", error=str(exc), code=exc.code)

            async def record() -> None:
                await self._terminal(tm, exc)

            outcome = replace(outcome, record=record)
        return outcome

    async def _retryable(self, tm: TileMessage, exc: RetryableError, delay: float) -> None:
        self.log.warning("retryable failure", error=str(exc), code=exc.code, delay=delay)
        self.ctx.metrics.retries.labels(code=exc.code).inc()
        if self.token is None:  # only the fenced owner may record the failure
            return
        # If the store is what failed, the nak still schedules the retry.
        with contextlib.suppress(RetryableError):
            try:
                await self.ctx.db.fail_tile(
                    tm.job_id, tm.tile_index, token=self.token, attempt_id=self.attempt_id,
                    trigger=TileTrigger.RETRYABLE_FAILURE, error_code=exc.code,
                    error=with_detail(exc), node=self.ctx.node, outcome="retryable",
                )  # fmt: skip
            except IllegalTransition:  # the tile moved on (e.g. done): close the attempt
                await self._end_attempt(AttemptOutcome.RETRYABLE, exc.code, with_detail(exc))

    async def _terminal(self, tm: TileMessage, exc: TerminalError) -> None:
        """Recorded between the DLQ copy and the term: tile and job failed for good."""
        try:
            await self.ctx.db.fail_tile(
                tm.job_id, tm.tile_index, token=self.token,
                attempt_id=self.attempt_id if self.token is not None else None,
                trigger=TileTrigger.TERMINAL_FAILURE, error_code=exc.code,
                error=with_detail(exc), node=self.ctx.node, outcome="terminal",
            )  # fmt: skip
        except IllegalTransition:  # e.g. failed before it was ever leased, or the tile moved on
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.TERMINAL, exc.code, with_detail(exc))
        await self.ctx.events.job_failed(tm.job_id, exc)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
