"""What a tile run is handed by its worker, so that it never reaches back into the worker.

:class:`TileContext` names everything one delivery may use: the stores, the job cache, the
scene cache and renderers, a read-only view of the worker's stop requests
(:class:`StopView`) and the events it publishes (:class:`TileEvents`). The worker builds one
context and passes it to every :class:`~services.worker.tile.TileRun`; a test builds its own
from in-memory doubles.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import OrderedDict, deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Container,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from proto import names as n
from proto.messages import TileDone, TilesDone
from services.worker.renderers import Renderer
from services.worker.scenes import SceneCache
from shared.core import crash
from shared.core.config import LeaseSettings, WorkerSettings
from shared.core.errors import TerminalError
from shared.core.lifecycle import JobState, JobTrigger, TileTrigger, is_terminal
from shared.core.retry import RetryPolicy
from shared.metadata import (
    AttemptOutcome,
    CommitOutcome,
    FirstFence,
    Job,
    JobControl,
    Tile,
    TileCommit,
)
from shared.nats.jetstream import publish_unconfirmed
from shared.nats.leases import Lease, LeaseOwner, ProgressPointer
from shared.objectstore import ObjectStore
from shared.service.announce import announce_completion, fail_job
from shared.service.logs import Log
from shared.service.metrics import Metrics
from shared.service.runtime import Runtime
from shared.service.settle import Delivery

__all__ = [
    "JobCache",
    "LeaseStore",
    "NatsTileEvents",
    "PassRates",
    "PointerStore",
    "Questions",
    "Result",
    "RunCommits",
    "RunTurn",
    "RunTurns",
    "StopReason",
    "StopView",
    "TileContext",
    "TileEvents",
    "TileStore",
    "Wakers",
    "control_stop",
]


class TileStore(Protocol):
    """The metadata operations a tile run uses (:class:`~shared.metadata.MetadataStore` has
    them; ``tests/doubles/metadata.py`` is the in-memory double, held to it by a contract)."""

    async def get_job(self, job_id: str) -> Job | None: ...

    async def get_tile(self, job_id: str, tile_index: int) -> Tile | None: ...

    async def is_cancel_requested(self, job_id: str) -> bool: ...

    async def job_control(self, job_id: str) -> JobControl: ...

    async def completed_by(self, job_id: str) -> int | None: ...

    async def unrelease_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int | None,
        attempt_id: str | None = None,
        node: str = "",
    ) -> bool: ...

    async def fence_first(
        self, job_id: str, tile_index: int, *, token: int, attempt_id: str, node: str,
        generation: int,
    ) -> FirstFence: ...  # fmt: skip

    async def fence_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int,
        attempt_id: str,
        node: str,
        resumed_from: int = 0,
    ) -> bool: ...

    async def record_progress(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int,
        samples_done: int,
        node: str = "",
        attempt_id: str | None = None,
    ) -> bool: ...

    async def commit_tile(self, done: TileCommit) -> CommitOutcome: ...

    async def fail_tile(
        self,
        job_id: str,
        tile_index: int,
        *,
        token: int | None,
        attempt_id: str | None,
        trigger: TileTrigger,
        error_code: str,
        error: str,
        node: str,
        outcome: AttemptOutcome | str,
        job_trigger: JobTrigger | None = None,
    ) -> Tile | None: ...

    async def end_attempt(
        self,
        attempt_id: str,
        *,
        outcome: AttemptOutcome | str,
        error_code: str | None = None,
        error: str | None = None,
    ) -> None: ...


class LeaseStore(Protocol):
    """The lease operations a tile run and its heartbeat use (:class:`~shared.nats.leases.Leases`
    satisfies it)."""

    async def acquire(self, key: str, owner: LeaseOwner) -> Lease | None: ...

    async def renew(self, lease: Lease) -> Lease: ...

    async def release(self, lease: Lease) -> bool: ...


class PointerStore(Protocol):
    """The progress pointers a tile run's checkpoints use
    (:class:`shared.nats.leases.ProgressPointers`)."""

    async def get(self, key: str) -> tuple[ProgressPointer, int] | None: ...

    async def put(self, key: str, pointer: ProgressPointer, *, last: int | None) -> int: ...

    async def delete(self, key: str) -> None: ...


class StopReason(StrEnum):
    """Why a tile run left its render loop without committing (its attempt's outcome)."""

    CANCELLED = "cancelled"  # the job was cancelled: tile cancelled, ack
    HANDED_BACK = "handed_back"  # the worker drains: checkpoint, release, nak at once
    LEASE_LOST = "lease_lost"  # the heartbeat lost the lease: settle nothing
    FENCED = "fenced"  # a fenced write was refused (a newer owner): settle nothing
    PAUSED = "paused"  # the job was paused: checkpoint now, hand the tile back unreleased, ack
    ENDED = "ended"  # the job failed for good (e.g. deadline_exceeded): tile failed, ack


def control_stop(control: JobControl) -> StopReason | None:
    """What the job's row (one read between passes) says a tile of it should do."""
    if control.cancel_requested or control.state is JobState.CANCELLED:
        return StopReason.CANCELLED
    if control.state is JobState.PAUSED:
        return StopReason.PAUSED
    if is_terminal(control.state) and control.state is not JobState.COMPLETED:
        return StopReason.ENDED
    return None


class Wakers:
    """Events of tile runs waiting, mid-pass, for news of their job (a cancel, a pause or a
    failure announced): the worker wakes them all when such an event about the job arrives."""

    def __init__(self) -> None:
        self._by_job: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def watch(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set by every :meth:`wake` of ``job_id`` while the block runs."""
        event = asyncio.Event()
        self._by_job.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            events = self._by_job.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._by_job[job_id]

    def wake(self, job_id: str) -> None:
        """Set the events of every tile run of ``job_id`` watching now."""
        for event in self._by_job.get(job_id, ()):
            event.set()

    def watching(self, job_id: str) -> int:
        """How many tile runs of ``job_id`` watch now (tests)."""
        return len(self._by_job.get(job_id, ()))


@dataclass(frozen=True)
class StopView:
    """The worker's stop requests, as a tile run reads them between passes and waits for them
    during a pass that can be interrupted (:attr:`handing_back`, :attr:`wakers`)."""

    handing_back: asyncio.Event
    #: ids of jobs announced cancelled
    cancelled: Container[str]
    #: job id -> when (monotonic) an event said its state changed (paused, failed, dead-
    #: lettered): a hint to read the job's row now rather than at the next checkpoint (the
    #: row decides: a job paused and resumed since must not stop)
    changed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: woken by the worker when a cancel or change of a job arrives (after recording it above)
    wakers: Wakers = dataclasses.field(default_factory=Wakers)

    def reason(self, job_id: str) -> StopReason | None:
        """Why a tile of ``job_id`` should stop now, or ``None``."""
        if self.handing_back.is_set():
            return StopReason.HANDED_BACK
        if job_id in self.cancelled:
            return StopReason.CANCELLED
        return None

    def changed_since(self, job_id: str, since: float) -> bool:
        """True if an event about ``job_id`` arrived after ``since`` (monotonic seconds)."""
        at = self.changed.get(job_id)
        return at is not None and at > since


class JobMoves:
    """One fence transaction per job at a time in this worker, while the plain statement wants
    the job moved: the others wait for it, then try the plain statement again.

    :meth:`TileStore.fence_first` declines every tile of a job that TILE_STARTED still moves
    (a ``running`` job: its first tile here makes it ``progressing``), and each declined tile
    went on to its own transaction (:meth:`TileStore.fence_tile`), which locks the job's row to
    move it. With runs of short tiles a worker takes up to two runs per kernel thread at once,
    so a job's start sent dozens of such transactions to wait on one row lock (in (a): 33 a
    job, each ``UPDATE jobs`` 3.8 ms). Now the first declined tile of a job (the *mover*) runs
    the transaction; a tile declined while it does waits for it and asks the plain statement
    again (batched with the others), and only if that declines too (a resume, a takeover, a
    job the mover did not move) takes its own transaction, as before. Nothing is written
    differently: the same statements, in a different order within this process.
    """

    def __init__(self) -> None:
        self._moving: dict[str, asyncio.Future[None]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, job_id: str) -> AsyncIterator[bool]:
        """The job's turn: ``False`` for the mover, which holds it for the block; ``True`` for a
        tile run that waited for another's turn to end, which holds none (the job has likely
        moved: the plain statement is worth asking again; a second decline takes its own
        transaction beside any others, as before)."""
        waited = False
        while (moving := self._moving.get(job_id)) is not None:
            waited = True
            await asyncio.shield(moving)
        if waited:
            yield True
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._moving[job_id] = done
        try:
            yield False
        finally:
            del self._moving[job_id]
            done.set_result(None)


Result = tuple[str, bytes, str]
"""A tile result to write as an object: ``(key, bytes, sha256)``."""


class RunCommits:
    """The results and commits of one run's tiles, held until none of its tiles is still
    rendering.

    The tiles of a run (:mod:`services.worker.run`) render side by side, their passes' bands
    queued together, so they end within about a band of each other; but a commit is one round
    trip and the next tile ends tens of milliseconds later, so each went to PostgreSQL alone
    (one statement per tile) and each tile-done to NATS in a write of its own. Now a tile
    rendered waits here (its heartbeat still renewing its lease) until every other tile of its
    run is rendered too or has ended its steps some other way; then the run's results are
    written in one call (:meth:`~shared.objectstore.ObjectStore.put_many`: the directory
    store's one thread call, where each result was a hop to a thread and back of its own), and
    they all commit in the same turn of the loop, the store's group commit
    (:class:`~shared.core.coalesce.Coalescer`) sending them as one statement. Each commit is
    still fenced on its own row and follows its own result's write. The message was settled
    after the run's last tile anyway, so nothing is acked later; a crash while tiles wait here
    loses their uncommitted results, which the redelivered run renders again (crash point
    ``worker.after_run_rendered``: every result written, none committed). A write that fails
    fails every tile of the run that had a result in it; a tile whose result is kept inline
    (nothing of it in the write) waits for the write all the same, then commits.

    ``left`` is told of each tile once, as it stops rendering (:meth:`RunTurn.left`); ``write``
    writes a batch of results (the worker: ``put_many`` not made durable, Worker flow step 6).
    """

    def __init__(
        self,
        tiles: Iterable[int],
        left: Callable[[], None] | None = None,
        write: Callable[[list[Result]], Awaitable[None]] | None = None,
    ) -> None:
        #: tiles of the run neither rendered nor ended
        self._rendering = set(tiles)
        self._left = left
        self._write = write
        self._results: list[Result] = []
        self._written: asyncio.Future[None] | None = None
        self._none_left = asyncio.Event()
        self._check()

    def ended(self, tile_index: int) -> None:
        """The tile's steps ended (any outcome): the run's commits wait for it no longer."""
        if tile_index in self._rendering:
            self._rendering.discard(tile_index)
            if self._left is not None:
                self._left()
        self._check()

    async def rendered(self, tile_index: int, result: Result | None = None) -> None:
        """The tile is rendered (``result``: its object to write, None for one kept inline):
        returns once no tile of the run is still rendering and the run's results are written
        (raises what the write raised)."""
        if result is not None:
            if self._write is None:
                raise TypeError("RunCommits without write was handed a result")
            if self._written is not None:  # (the run's write has begun: never commit unwritten)
                await self._write([result])
            else:
                self._results.append(result)
        self.ended(tile_index)
        await self._none_left.wait()
        if self._written is None:  # the first tile through writes for the run
            self._written = asyncio.ensure_future(self._write_all())
            # (its error is read here too: every waiting tile may have been cancelled)
            self._written.add_done_callback(_retrieved)
        try:
            await asyncio.shield(self._written)
        except Exception:
            if result is not None:
                raise
            # kept inline, nothing of it in the write: it commits whatever became of the others

    async def _write_all(self) -> None:
        results, self._results = self._results, []
        if results and self._write is not None:
            await self._write(results)
        crash.crash_point("worker.after_run_rendered")

    def _check(self) -> None:
        if not self._rendering:
            self._none_left.set()


def _retrieved(done: asyncio.Future[None]) -> None:
    """Mark a finished write's error as read (no "exception was never retrieved")."""
    if not done.cancelled():
        done.exception()


class RunTurn:
    """A started run's turn (:class:`RunTurns`): how many of its tiles are still to render."""

    def __init__(self, turns: RunTurns, tiles: int) -> None:
        self._turns = turns
        #: tiles of the run not yet rendered (nor ended), counted in the turns' ``pending``
        #: while the turn is held
        self.rendering = tiles
        self.held = False

    def left(self) -> None:
        """One tile of the run is rendered, or ended its steps some other way."""
        if self.held and self.rendering > 0:
            self.rendering -= 1
            self._turns._left(1)

    def _end(self) -> None:
        if self.held:
            self.held = False
            self._turns._ended(self.rendering)


class RunTurns:
    """Runs whose tiles have started in this worker: at most ``turns`` of them (the worker: one
    per kernel thread and one more), and a new one only while the started runs have at most
    ``lead`` tiles left to render (the worker: also one per kernel thread and one more).

    A worker holds two messages per kernel thread (the dispatch window counts them), and a run's
    tiles are all leased and fenced when it starts, their passes' bands queued behind those of
    the runs started before it. With four runs of eight started at once, (a)'s tiles were
    leased about 2.2 s before their commit on two threads, past the heartbeat interval, so
    nearly every tile renewed its lease. Now a run beyond the turns waits here unstarted —
    nothing leased, fenced or rendered, its message's ack deadline reset every heartbeat
    interval — and starts, in the order they came, once a turn is free and the tiles ahead of
    it are few; it is still in hand, so it starts at once, with no fetch between.

    Why the tiles too (issue 19): three runs of eight, the turns of two threads, still queued
    24 tiles at once, whose last ones were leased 2.0 s before their commit on this host's
    slower days, so 48 of (a)'s 64 tiles renewed their leases (a KV write and its answer each:
    0.46 core-ms a tile of the job, measured with the renewals pushed past the job). Counted in
    tiles, a run starts when the started ones have ``lead`` tiles left — each thread's last
    and one queued — so its lease and fence overlap their render, no thread waits for them, and
    no tile is leased much more than two runs' render ahead of its commit. Tiles that render
    at once (8x8 at 1 spp, on the loop's own thread) leave nothing pending, so short runs still
    start up to ``turns`` at once. The one turn more than the threads keeps a run leased,
    fenced and queued behind the rendering ones (with one turn per thread, a single-thread
    worker's thread waited after every run: busy 98.5 % of the render span, against 99.6).
    A message of one tile never waits: it is a tile long enough to be sent alone, and two per
    thread keep the cores busy through each one's I/O (Worker flow). A drain hands a waiting
    run back at once, nothing of it started.
    """

    def __init__(self, turns: int, lead: int | None = None) -> None:
        if turns < 1:
            raise ValueError(f"turns must be at least 1, not {turns}")
        self.turns = turns
        #: a run starts only while the started ones have at most this many tiles to render
        #: (``None``: any number, the turns alone bound the runs)
        self.lead = lead
        #: runs holding a turn (started, or handed a turn and about to start)
        self.started = 0
        #: tiles of the runs holding a turn that are neither rendered nor ended
        self.pending = 0
        self._waiting: deque[tuple[asyncio.Future[None], RunTurn]] = deque()

    @property
    def waiting(self) -> int:
        """Runs waiting for a turn."""
        return sum(1 for f, _ in self._waiting if not f.done())

    @contextlib.asynccontextmanager
    async def turn(
        self, delivery: Delivery, tiles: int, interval: float, handing_back: asyncio.Event
    ) -> AsyncIterator[RunTurn | None]:
        """A turn for the run of ``delivery`` (``tiles`` tiles), held for the block: the turn
        once it has one; ``None`` (holding none) if the worker began handing its messages back
        first."""
        mine = RunTurn(self, tiles)
        got = await self._wait(delivery, mine, interval, handing_back)
        try:
            yield mine if got else None
        finally:
            if got:
                mine._end()

    def _room(self) -> bool:
        return self.started < self.turns and (self.lead is None or self.pending <= self.lead)

    def _take(self, turn: RunTurn) -> None:
        turn.held = True
        self.started += 1
        self.pending += turn.rendering

    async def _wait(
        self, delivery: Delivery, turn: RunTurn, interval: float, back: asyncio.Event
    ) -> bool:
        if back.is_set():
            return False  # (the worker hands its messages back: start nothing more)
        if not self.waiting and self._room():
            self._take(turn)
            return True
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((mine, turn))
        crash.crash_point("worker.run_waiting")
        backing = asyncio.ensure_future(back.wait())
        either: set[asyncio.Future[Any]] = {mine, backing}
        try:
            while not mine.done() and not back.is_set():
                await asyncio.wait(either, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                if not mine.done() and not back.is_set():
                    await delivery.in_progress()
        except BaseException:
            if mine.done() and not mine.cancelled():
                turn._end()  # handed a turn as this wait failed: it goes to the next run
            mine.cancel()
            raise
        finally:
            backing.cancel()
        if mine.done() and back.is_set():
            turn._end()  # handed a turn as the drain began: not started, the turn goes on
        elif mine.done():
            # Its last reset may be an interval old, and its tiles' heartbeats first reset it
            # an interval after their leases: reset it now, as a message fetched now would be.
            await self._reset(delivery, turn)
            return True
        mine.cancel()  # (skipped when a turn is passed on)
        return False

    async def _reset(self, delivery: Delivery, turn: RunTurn) -> None:
        try:
            await delivery.in_progress()
        except BaseException:
            turn._end()  # (the turn was ours: the next run takes it)
            raise

    def _left(self, tiles: int) -> None:
        self.pending -= tiles
        self._pass_on()

    def _ended(self, rest: int) -> None:
        """A run's turn ends (``rest``: its tiles still counted as pending)."""
        self.started -= 1
        self.pending -= rest
        self._pass_on()

    def _pass_on(self) -> None:
        """Turns to the runs that waited longest, while there is room for them."""
        while self._waiting and self._room():
            waiter, turn = self._waiting.popleft()
            if not waiter.done():
                self._take(turn)  # the turn is its now
                waiter.set_result(None)


class JobCache:
    """Job rows, cached: what tiles need of them (scene, settings, input hash) never changes.

    A cached row's state may be stale; the fence checks the live state. A terminal, paused or
    cancel-requested row is read again. At most ``size`` rows, least recently used dropped.
    Tile runs that need a row while another's read of it is on its way share that read: a run's
    tiles all start together, and each read the new job's row on its own (16 to 21 reads of one
    row per (a) job, issue 19).
    """

    def __init__(self, db: TileStore, size: int) -> None:
        self.db, self.size = db, size
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._reading: dict[str, asyncio.Future[Job | None]] = {}

    async def get(self, job_id: str) -> Job | None:
        """The job row, or ``None`` for an unknown job."""
        job = self._jobs.get(job_id)
        if job is None or is_terminal(job.state) or job.cancel_requested or _paused(job):
            job = await self._read(job_id)
            if job is None:
                return None
        self._jobs[job_id] = job
        self._jobs.move_to_end(job_id)
        while len(self._jobs) > self.size:
            self._jobs.popitem(last=False)
        return job

    async def _read(self, job_id: str) -> Job | None:
        """The row as read now, or by a read of it already on its way (its error too)."""
        reading = self._reading.get(job_id)
        if reading is None:
            reading = asyncio.ensure_future(self.db.get_job(job_id))
            self._reading[job_id] = reading
            reading.add_done_callback(lambda done: self._forget(job_id, done))
        # shielded: one caller's cancellation does not end the read the others wait for
        return await asyncio.shield(reading)

    def _forget(self, job_id: str, done: asyncio.Future[Job | None]) -> None:
        if self._reading.get(job_id) is done:
            del self._reading[job_id]
        if not done.cancelled():
            done.exception()  # (seen: a read whose callers were all cancelled fails quietly)


class PassRates:
    """Seconds of one core per pixel-sample of each job's slowest adaptive pass on this worker
    (at most ``size`` jobs, the least recently measured dropped): a tile whose job this worker
    has already rendered sizes its first pass from it (:func:`services.worker.render.first_pass`)
    instead of starting at ``TESSERA_SAMPLES_PER_PASS``. The slowest, not the last: a scene's
    tiles differ in cost (sky, glass), and a first pass sized on a cheap tile's rate would run
    long on an expensive one; sized on the slowest seen, it errs towards short passes, as the
    later ones do."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._rates: OrderedDict[str, float] = OrderedDict()

    def get(self, job_id: str) -> float | None:
        """The job's slowest measured rate, or ``None``."""
        return self._rates.get(job_id)

    def record(self, job_id: str, seconds: float, pixel_samples: int) -> None:
        """A pass of ``pixel_samples`` took ``seconds`` of one core (nothing measured: ignored)."""
        if seconds <= 0 or pixel_samples <= 0:
            return
        rate = seconds / pixel_samples
        self._rates[job_id] = max(rate, self._rates.get(job_id, rate))
        self._rates.move_to_end(job_id)
        while len(self._rates) > self.size:
            self._rates.popitem(last=False)


class Questions:
    """Which jobs have a tile run in this worker that owns an unfinished tile.

    After its commit a tile run asks whether its job is complete (docs/architecture.md,
    "Worker flow" step 7). While another run of the same job in this worker *owns* its tile —
    fenced under a lease it has not lost, not yet committed — the job is not complete, and
    whoever makes that tile done later (that run, or the next owner after it lets the tile go
    or dies) commits after this commit and asks then, seeing it. So this commit need not ask
    (:meth:`defer`): one question per burst of a job's tiles instead of one per tile. Nothing
    but the event loop touches it.
    """

    def __init__(self) -> None:
        #: job -> the ``lost`` events of the heartbeats of its runs that own their tile
        self._owners: dict[str, list[asyncio.Event]] = {}

    def own(self, job_id: str, lost: asyncio.Event) -> None:
        """A tile run of ``job_id`` fenced its tile under the lease whose heartbeat sets
        ``lost`` if it goes (it then stops counting as an owner at once)."""
        self._owners.setdefault(job_id, []).append(lost)

    def disown(self, job_id: str, lost: asyncio.Event) -> None:
        """That run committed its tile, or let it go (ended, failed, handed it back)."""
        held = [e for e in self._owners.get(job_id, []) if e is not lost]
        if held:
            self._owners[job_id] = held
        else:
            self._owners.pop(job_id, None)

    def defer(self, job_id: str) -> bool:
        """After a commit (its run no longer an owner): ``True`` if another run of the job
        owns an unfinished tile here under a lease not known lost, so the question can wait
        for that tile's commit."""
        return self.owners(job_id) > 0

    def owners(self, job_id: str) -> int:
        """Tile runs of ``job_id`` that own their tile here, their lease not known lost."""
        return sum(1 for lost in self._owners.get(job_id, []) if not lost.is_set())


def _paused(job: Job) -> bool:
    return job.state is JobState.PAUSED


class TileEvents(Protocol):
    """What a tile run tells the rest of Tessera."""

    async def tile_done(self, done: TileDone, fence: int) -> None:
        """Announce a committed tile (``fence``: the committing owner's token, in the id)."""

    async def tiles_done(self, done: TilesDone) -> None:
        """Announce that every tile of a job is done (the finalizer's cue)."""

    async def job_failed(self, job_id: str, error: TerminalError) -> None:
        """Fail the tile's job for good (if still legal) and tell watchers."""


class NatsTileEvents:
    """:class:`TileEvents` on the deployment's EVENTS stream."""

    def __init__(self, rt: Runtime, log: Log) -> None:
        self.rt, self.log = rt, log

    async def tile_done(self, done: TileDone, fence: int) -> None:
        """Publish ``done`` under ``done:<job>:<i>:<fence>`` (a repeat is absorbed), without
        waiting for the server's confirmation: a tile-done event is a progress notification
        (the console, the dispatcher's nudge, the finalizer's read-ahead) that nothing
        depends on receiving; the job's completion is the confirmed tiles-done event
        (docs/architecture.md, "Worker flow" step 7)."""
        await publish_unconfirmed(
            self.rt.nc,
            self.rt.names.event_subject(done.job_id, n.EventKind.TILE_DONE),
            done,
            msg_id=n.done_msg_id(done.job_id, done.tile_index, fence),
        )

    async def tiles_done(self, done: TilesDone) -> None:
        """:func:`~shared.service.announce.announce_completion` (a repeat is absorbed)."""
        await announce_completion(self.rt, done.job_id, done.completion)

    async def job_failed(self, job_id: str, error: TerminalError) -> None:
        """:func:`~shared.service.announce.fail_job` by ``terminal_failure``."""
        trigger = JobTrigger.TERMINAL_FAILURE
        await fail_job(self.rt, job_id, trigger, code=error.code, error=str(error), log=self.log)


@dataclass(frozen=True)
class TileContext:
    """Everything a tile run uses; built once per worker."""

    db: TileStore
    leases: LeaseStore
    progress: PointerStore
    store: ObjectStore
    events: TileEvents
    jobs: JobCache
    scenes: SceneCache
    #: the renderers this worker runs, by name (a job's ``renderer`` picks one)
    renderers: Mapping[str, Renderer]
    stop: StopView
    metrics: Metrics
    lease_config: LeaseSettings
    worker_config: WorkerSettings
    retry: RetryPolicy
    node: str
    log: Log
    #: runs started here, at most one per kernel thread and one more (the others wait unstarted)
    turns: RunTurns
    #: the slowest measured rate of each job's passes (the first pass of its next tile)
    rates: PassRates = dataclasses.field(default_factory=PassRates)
    #: the runs of each job that own an unfinished tile here (a commit then need not ask)
    questions: Questions = dataclasses.field(default_factory=Questions)
    #: the fence transaction of each job that one tile run here is running (the others wait)
    moves: JobMoves = dataclasses.field(default_factory=JobMoves)
