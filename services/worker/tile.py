"""One delivery of one tile, step by step (DESIGN.md "Worker flow").

1. decode; look up job and tile — terminal job or done tile: (re)announce done if needed, ack;
2. lease (held by a live owner: ``nak`` with a delay, never work in parallel);
3. fence the tile row with the lease's acquire revision and record the attempt;
4. resume from the progress pointer only if its ``input_hash`` matches;
5. render in passes off the loop; checkpoint every ``checkpoint_interval``; check cancel and the
   lease between passes;
6. write the result (content-addressed), commit it **fenced**;
7. publish tile-done, clean up, release the lease, **then ack**.

Outcome → JetStream action happens only in :meth:`TileRun.run`: success → ack, retryable →
``nak(delay)``, terminal → DLQ copy + ``term()``, lease lost or fenced → nothing (the new owner
holds the message's fate), hand-back on shutdown → checkpoint + ``nak``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from typing import TYPE_CHECKING

from nats.aio.msg import Msg

import kernel
from proto import names as n
from proto.messages import TileDone, TileMessage
from services.deadletter import dead_letter
from services.worker.checkpoints import Checkpoints, Progress
from services.worker.heartbeat import Heartbeat
from services.worker.scenes import KernelFailure
from shared import crash
from shared.config import Tuning
from shared.errors import DecodeError, LeaseLost, RetryableError, TerminalError, TesseraError
from shared.jetstream import ack_sync_retry, publish
from shared.leases import Lease, LeaseOwner
from shared.lifecycle import IllegalTransition, JobTrigger, TileState, TileTrigger, is_terminal
from shared.metadata import AttemptOutcome, CommitOutcome, Job, Tile, TileCommit
from shared.objectstore import tile_result_key
from shared.retry import backoff
from shared.tiles import Accumulator, Rect, to_npy

if TYPE_CHECKING:
    from services.worker.loop import Worker

__all__ = ["TileRun"]


class Stalled(RetryableError):
    """A sample pass made no progress within ``progress_timeout`` (the watchdog fired)."""

    code = "stalled"


#: error code and message of an attempt cut short by the end of the drain's grace period
_CUT = "grace_expired", "the worker stopped before the attempt ended (drain grace period over)"


class _Stop(Exception):
    """Internal: leave the render loop without committing (cancel, hand-back, lease loss)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class TileRun:
    """Processes one TILES delivery."""

    def __init__(self, worker: Worker, msg: Msg) -> None:
        self.w = worker
        self.rt = worker.rt
        self.msg = msg
        self.attempt_id = uuid.uuid4().hex
        self.log = worker.log.bind(attempt_id=self.attempt_id)
        self.token: int | None = None  # our fencing token once the tile row is fenced
        self.started = time.monotonic()  # reset when the tile row is fenced
        self.released = False

    async def run(self) -> None:
        """Process the delivery and settle the message exactly once."""
        try:
            tm = TileMessage.decode(self.msg.data)
        except DecodeError as exc:
            await dead_letter(self.rt, self.msg, job_id=None, unit=n.DLQ_UNIT_JOB, error=exc)
            await self.msg.term()
            return
        self.log = self.log.bind(job_id=tm.job_id, tile=tm.tile_index)
        try:
            await self._process(tm)
        except IllegalTransition as exc:
            # A race with a state change elsewhere (a cancel, a finished job): nothing to redo.
            self.log.info("tile no longer applicable", error=str(exc))
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.FENCED, exc.code, str(exc))
            await ack_sync_retry(self.msg)
        except TerminalError as exc:
            await self._terminal(tm, exc)
        except RetryableError as exc:
            await self._retryable(tm, exc)
        except Exception as exc:  # a bug: consume logs it; the message comes back after ack_wait
            with contextlib.suppress(Exception):
                await self._end_attempt(AttemptOutcome.RETRYABLE, TesseraError.code, repr(exc))
            raise

    # ------------------------------------------------------------------ steps 1-3

    async def _process(self, tm: TileMessage) -> None:
        job, tile = await self._lookup(tm)
        if job is None or tile is None:
            return
        crash.crash_point("worker.before_lease")
        owner = LeaseOwner(node=self.rt.node, attempt_id=self.attempt_id)
        lease = await self.rt.leases.acquire(n.lease_key_tile(tm.job_id, tm.tile_index), owner)
        if lease is None:
            self.log.info("lease held by another owner; backing off")
            await self.msg.nak(delay=float(self.rt.settings.tuning.lease_ttl))
            return
        beat = Heartbeat(
            self.rt.leases, lease, self.msg, self.rt.settings.tuning.heartbeat_interval, self.log
        ).start()
        try:
            await self._leased(job, tile, beat)
        finally:
            # Even after LeaseLost: a renew buffered while disconnected may still land, and a
            # release of a lease that is no longer ours is refused harmlessly.
            await self._release(await beat.stop())
            if beat.lost.is_set():
                self.rt.metrics.lease_renewal_failures.labels(kind="tile").inc()

    async def _lookup(self, tm: TileMessage) -> tuple[Job | None, Tile | None]:
        """Job and tile, or ``(None, None)`` once the message is settled here.

        The job row may come from the worker's cache, so its state can be stale; the fence
        re-checks the job's state and cancel flag in the same transaction that takes the tile.
        """
        job = await self.w.job(tm.job_id)
        tile = await self.rt.db.get_tile(tm.job_id, tm.tile_index) if job else None
        if job is None or tile is None:
            self.log.warning("tile message for an unknown job or tile; dropping")
        elif tile.state is TileState.DONE:
            await self._announce(job, tile.tile_index, tile.result_key, tile.lease_fence)
            self.log.info("tile already done")
        elif is_terminal(job.state) or job.cancel_requested or is_terminal(tile.state):
            self.log.info("job or tile is final; dropping", state=job.state.value)
        else:
            return job, tile
        await ack_sync_retry(self.msg)
        return None, None

    async def _leased(self, job: Job, tile: Tile, beat: Heartbeat) -> None:
        token = beat.lease.token
        self.checkpoints = Checkpoints(self.rt, job, tile, self.attempt_id, self.log)
        progress = await self.checkpoints.resume_point()
        # Loaded before the fence (a read), so the attempt records the resume that happens.
        acc = await self.checkpoints.load(progress)
        fenced = await self.rt.db.fence_tile(
            job.job_id,
            tile.tile_index,
            token=token,
            attempt_id=self.attempt_id,
            node=self.rt.node,
            resumed_from=progress.resumed_from,
            seen=tile,
        )
        if not fenced:
            self.log.info("fence refused: tile done or taken by a newer owner")
            await self._release(await beat.stop())
            await ack_sync_retry(self.msg)
            return
        self.token = token
        self._acquired(tile, token)
        crash.crash_point("worker.after_lease")
        if progress.resumed_from:
            self.rt.metrics.resumes.inc()
            self.log.info("resumed from checkpoint", samples=progress.resumed_from)
        with self.rt.metrics.tiles_in_flight.track_inprogress():
            try:
                try:
                    await self._render(job, tile, acc, progress, beat)
                    await self._commit(job, tile, acc, progress, beat)
                except _Stop as stop:
                    await self._stopped(job, tile, acc, progress, beat, stop.why)
            except asyncio.CancelledError:
                # The drain's grace period ran out (or the loop is going away) mid-attempt:
                # the message is redelivered after ack_wait; say so in the attempt row.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._end_attempt(AttemptOutcome.HANDED_BACK, *_CUT))
                raise

    def _acquired(self, tile: Tile, token: int) -> None:
        """Log and count a fenced acquire; a row still leased means a takeover."""
        self.started = time.monotonic()
        m = self.rt.metrics
        m.tile_attempts.inc()
        if tile.lease_fence > 0 and tile.state in (TileState.LEASED, TileState.PROGRESSING):
            m.lease_takeovers.inc()
            self.log.warning("lease taken over", token=token, previous_fence=tile.lease_fence)
        else:
            self.log.info("lease acquired", token=token)

    # ------------------------------------------------------------------ steps 4-5

    async def _render(
        self, job: Job, tile: Tile, acc: Accumulator, progress: Progress, beat: Heartbeat
    ) -> None:
        tuning = self.rt.settings.tuning
        prepared = await self.w.scenes.get(job, self.w.kernels.executor)
        rect = _rect(tile)
        size = tuning.samples_per_pass
        last_checkpoint = time.monotonic()
        while progress.samples < job.spp:
            self._between_passes(job, beat)
            end = min(job.spp, progress.samples + size)
            started = time.monotonic()
            await self._pass(prepared, rect, progress.samples, end, acc)
            size = pass_size(end - progress.samples, time.monotonic() - started, tuning)
            progress.samples = end
            due = time.monotonic() - last_checkpoint >= tuning.checkpoint_interval
            if due and progress.samples < job.spp:
                # The cancel event may have been missed (a reconnect): ask the source of truth.
                if await self.rt.db.is_cancel_requested(job.job_id):
                    raise _Stop("cancelled")
                self._between_passes(job, beat)
                await self._checkpoint(acc, progress, beat.lease.token)
                last_checkpoint = time.monotonic()

    def _between_passes(self, job: Job, beat: Heartbeat) -> None:
        if beat.lost.is_set():
            raise _Stop("lease_lost")
        if self.w.handing_back.is_set():
            raise _Stop("handed_back")
        if job.job_id in self.w.cancelled:
            raise _Stop("cancelled")

    async def _pass(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> None:
        try:
            await asyncio.wait_for(
                self.w.kernels.render(prepared, rect, start, end, acc),
                self.rt.settings.tuning.progress_timeout,
            )
        except TimeoutError:
            raise Stalled(f"samples {start}..{end} made no progress") from None
        except (ValueError, ArithmeticError, kernel.SceneError) as exc:
            raise KernelFailure(f"kernel failed on samples {start}..{end}: {exc}") from exc
        samples = (end - start) * (rect[2] - rect[0]) * (rect[3] - rect[1])
        self.rt.metrics.samples_rendered.inc(samples)

    async def _checkpoint(self, acc: Accumulator, progress: Progress, token: int) -> None:
        if not await self.checkpoints.write(acc, progress, token):
            raise _Stop("fenced")

    # ------------------------------------------------------------------ steps 6-7

    async def _commit(
        self, job: Job, tile: Tile, acc: Accumulator, progress: Progress, beat: Heartbeat
    ) -> None:
        data = to_npy(acc)
        sha = _sha256(data)
        inline = len(data) <= self.rt.settings.tuning.inline_result_bytes
        key = None if inline else tile_result_key(job.job_id, tile.tile_index, sha)
        if key is not None:
            await self.rt.store.put(key, data)
        crash.crash_point("worker.after_result_write")
        if beat.lost.is_set():
            raise _Stop("lease_lost")  # recorded like a loss between passes
        done = TileCommit(
            job.job_id,
            tile.tile_index,
            token=beat.lease.token,
            attempt_id=self.attempt_id,
            result_key=key,
            result_sha256=sha,
            result_data=data if inline else None,
            samples_done=job.spp,
            node=self.rt.node,
        )
        outcome = await self.rt.db.commit_tile(done)
        if outcome is not CommitOutcome.COMMITTED:
            await self._refused(job, tile, progress, beat, outcome)
            return
        crash.crash_point("worker.after_commit")
        await self._announce(job, tile.tile_index, key, beat.lease.token)
        await self.checkpoints.cleanup(progress)  # (the commit closed the attempt as done)
        await self._release(await beat.stop())
        crash.crash_point("worker.before_ack")
        await ack_sync_retry(self.msg)
        self.rt.metrics.tiles_completed.inc()
        self.rt.metrics.tile_seconds.observe(time.monotonic() - self.started)
        self.log.info("tile done", samples=job.spp, resumed_from=progress.resumed_from)

    async def _refused(
        self, job: Job, tile: Tile, progress: Progress, beat: Heartbeat, outcome: CommitOutcome
    ) -> None:
        """The commit was refused (the store closed the attempt as ``fenced``): count it under
        its reason, never as a completed tile. Fenced: the newer owner holds the message's
        fate. Already done by another owner: announce their result and ack this copy."""
        self.rt.metrics.commits_refused.labels(reason=outcome.value).inc()
        if outcome is CommitOutcome.FENCED:
            self.log.warning("commit refused by the fence: a newer owner has the tile")
            return
        current = await self.rt.db.get_tile(job.job_id, tile.tile_index)
        fence = beat.lease.token if current is None else current.lease_fence
        self.log.warning(
            "commit refused: another owner committed the tile first", committed_by_fence=fence
        )
        if current is not None:
            await self._announce(job, tile.tile_index, current.result_key, fence)
        await self.checkpoints.cleanup(progress)
        await self._release(await beat.stop())
        await ack_sync_retry(self.msg)

    async def _announce(
        self, job: Job, tile_index: int, result_key: str | None, fence: int
    ) -> None:
        # An inline result (no object) is announced with an empty key; the row names it.
        done = TileDone(job.job_id, tile_index, self.attempt_id, result_key or "", job.input_hash)
        ack = await publish(
            self.rt.js,
            self.rt.names.event_subject(job.job_id, n.EventKind.TILE_DONE),
            done,
            msg_id=n.done_msg_id(job.job_id, tile_index, fence),
        )
        self.rt.metrics.published(ack)

    async def _release(self, lease: Lease) -> None:
        if self.released:
            return
        self.released = True
        try:
            await self.rt.leases.release(lease)
        except RetryableError as exc:
            self.log.warning("lease release failed; it expires on its own", error=str(exc))

    # ------------------------------------------------------------------ outcomes

    async def _stopped(
        self,
        job: Job,
        tile: Tile,
        acc: Accumulator,
        progress: Progress,
        beat: Heartbeat,
        why: str,
    ) -> None:
        db, token = self.rt.db, beat.lease.token
        if why == "cancelled":
            await db.fail_tile(
                job.job_id, tile.tile_index, token=token, attempt_id=self.attempt_id,
                trigger=TileTrigger.CANCEL, error_code="cancelled", error="job cancelled",
                node=self.rt.node, outcome="cancelled",
            )  # fmt: skip
            await self.checkpoints.cleanup(progress)
            await self._release(await beat.stop())
            await ack_sync_retry(self.msg)
        elif why == "handed_back":
            try:
                if progress.samples > progress.resumed_from:
                    await self._checkpoint(acc, progress, token)
            except _Stop as fenced:  # a newer owner has the tile: it is not ours to hand back
                why = fenced.why
            else:
                await db.end_attempt(self.attempt_id, outcome="handed_back")
                await self._release(await beat.stop())
                await self.msg.nak()
        if why in ("lease_lost", "fenced"):  # the tile is someone else's now; settle nothing
            await db.end_attempt(self.attempt_id, outcome=why, error_code=why)
        self.log.info("tile stopped", why=why, samples=progress.samples)

    async def _end_attempt(self, outcome: AttemptOutcome, code: str, error: str) -> None:
        """Close our attempt (if we fenced one) when no tile move records it; the first
        outcome wins, so an attempt already closed (``done``, ``fenced``) keeps its own."""
        if self.token is not None:
            await self.rt.db.end_attempt(
                self.attempt_id, outcome=outcome, error_code=code, error=error
            )

    async def _retryable(self, tm: TileMessage, exc: RetryableError) -> None:
        if isinstance(exc, LeaseLost):
            self.log.warning("lease lost; leaving the tile to its new owner", error=str(exc))
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.LEASE_LOST, exc.code, str(exc))
            return
        delay = backoff(self.rt.retry, self.msg.metadata.num_delivered)
        self.log.warning("retryable failure", error=str(exc), code=exc.code, delay=delay)
        self.rt.metrics.retries.labels(code=exc.code).inc()
        if self.token is not None:  # only the fenced owner may record the failure
            # If the store is what failed, the nak below still schedules the retry.
            with contextlib.suppress(RetryableError):
                try:
                    await self.rt.db.fail_tile(
                        tm.job_id, tm.tile_index, token=self.token, attempt_id=self.attempt_id,
                        trigger=TileTrigger.RETRYABLE_FAILURE, error_code=exc.code,
                        error=str(exc), node=self.rt.node, outcome="retryable",
                    )  # fmt: skip
                except IllegalTransition:  # the tile moved on (e.g. done): close the attempt
                    await self._end_attempt(AttemptOutcome.RETRYABLE, exc.code, str(exc))
        await self.msg.nak(delay=delay)

    async def _terminal(self, tm: TileMessage, exc: TerminalError) -> None:
        self.log.error("terminal failure", error=str(exc), code=exc.code)
        unit = n.dlq_unit_tile(tm.tile_index)
        await dead_letter(self.rt, self.msg, job_id=tm.job_id, unit=unit, error=exc)
        try:
            await self.rt.db.fail_tile(
                tm.job_id, tm.tile_index, token=self.token,
                attempt_id=self.attempt_id if self.token is not None else None,
                trigger=TileTrigger.TERMINAL_FAILURE, error_code=exc.code, error=str(exc),
                node=self.rt.node, outcome="terminal",
            )  # fmt: skip
        except IllegalTransition:  # e.g. failed before it was ever leased, or the tile moved on
            with contextlib.suppress(RetryableError):
                await self._end_attempt(AttemptOutcome.TERMINAL, exc.code, str(exc))
        await self.w.fail_job(tm.job_id, JobTrigger.TERMINAL_FAILURE, exc)
        await self.msg.term()


def pass_size(samples: int, seconds: float, tuning: Tuning) -> int:
    """Samples per pixel of the next pass, after a pass of ``samples`` took ``seconds``.

    Sized from the measured rate to take about ``pass_seconds``: never below
    ``samples_per_pass``, and at most 16 times the last pass, so one fast outlier cannot make a
    pass that outlasts the cancel and checkpoint grain by much. ``seconds`` is wall time on
    the loop (queueing for a kernel thread included), so the estimate errs towards short passes.
    """
    floor = tuning.samples_per_pass
    if tuning.pass_seconds <= 0 or samples <= 0:
        return floor
    if seconds <= 0:
        return max(floor, 16 * samples)
    wanted = int(samples * tuning.pass_seconds / seconds)
    return max(floor, min(wanted, 16 * samples))


def _rect(tile: Tile) -> Rect:
    return (tile.x0, tile.y0, tile.x1, tile.y1)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
