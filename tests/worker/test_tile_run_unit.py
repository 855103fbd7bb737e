"""The tile run on its own: in-memory stores, the real kernel on an 8×8 tile, no servers.

The stores are the doubles of ``tests/doubles`` (held to NATS KV and PostgreSQL by the contract
suites there). The delivery is :class:`~tests.doubles.delivery.FakeDelivery`, which records how it
was settled. Each case asserts the settle decision and what the run left in the stores. Events
in the run (a lease lost, a newer owner, a drain) are made to happen after a given sample pass
by :class:`HookedKernels` (the real ``tessera`` renderer, hooked), so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kernel
from kernel.rect import Rect
from proto import names as n
from proto.messages import TileDone, TileMessage, TilesDone
from services.worker.context import JobCache, Questions, RunTurns, StopView, TileContext
from services.worker.renderers.tessera import TesseraKernel
from services.worker.scenes import SceneCache
from services.worker.tile import TileRun
from shared.core.config import LeaseSettings, WorkerSettings
from shared.core.errors import LeaseLost, RetryableError, StoreUnavailable, TerminalError
from shared.core.lifecycle import JobState, JobTrigger, TileState
from shared.core.retry import RetryPolicy
from shared.core.tiles import Accumulator
from shared.metadata import AttemptOutcome, CommitOutcome, FirstFence, Job, TileCommit
from shared.nats.leases import Lease, LeaseOwner
from shared.objectstore import DirectoryStore
from shared.service.logs import Log
from shared.service.metrics import Metrics
from tests.doubles.delivery import FakeDelivery
from tests.doubles.kv import MemoryLeases, MemoryPointers
from tests.doubles.metadata import MemoryMetadata
from tests.helpers import eventually
from tests.metadata.conftest import make_new_job

SPP = 2  # two passes of one sample: the hooks run between them


class HookedKernels(TesseraKernel):
    """The real kernel renderer; ``after_pass(end)`` runs once a pass reaching ``end`` is done."""

    def __init__(self) -> None:
        super().__init__(1)
        self.after_pass: Callable[[int], Awaitable[None]] | None = None
        self.took: list[float] = []  # what each pass reported it took
        self.ran: list[tuple[int, int]] = []  # each pass's samples, in order

    async def render(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        seconds = await super().render(prepared, rect, start, end, acc)
        self.took.append(seconds)
        self.ran.append((start, end))
        if self.after_pass is not None:
            await self.after_pass(end)
        return seconds


class WatchedLeases(MemoryLeases):
    """Leases whose refused renews are seen (a heartbeat that found its lease gone)."""

    def __init__(self) -> None:
        super().__init__(ttl=10)
        self.refused = asyncio.Event()

    async def renew(self, lease: Lease) -> Lease:
        try:
            return await super().renew(lease)
        except LeaseLost:
            self.refused.set()
            raise


class FlakyMetadata(MemoryMetadata):
    """The metadata double, whose next ``commit_tile`` or ``completed_by`` can fail as a
    database going away; ``completed_by`` calls are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.commit_error: Exception | None = None
        self.question_error: Exception | None = None
        self.questions = 0

    async def completed_by(self, job_id: str) -> int | None:
        self.questions += 1
        if (error := self.question_error) is not None:
            self.question_error = None
            raise error
        return await super().completed_by(job_id)

    async def commit_tile(self, done: TileCommit) -> CommitOutcome:
        if (error := self.commit_error) is not None:
            self.commit_error = None
            raise error
        return await super().commit_tile(done)


@dataclass
class Events:
    """:class:`~services.worker.context.TileEvents`, recorded."""

    done: list[tuple[TileDone, int]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    all_done: list[TilesDone] = field(default_factory=list)

    async def tile_done(self, done: TileDone, fence: int) -> None:
        self.done.append((done, fence))

    async def tiles_done(self, done: TilesDone) -> None:
        self.all_done.append(done)

    async def job_failed(self, job_id: str, error: TerminalError) -> None:
        self.failed.append((job_id, error.code))


@dataclass
class Rig:
    """One worker's context on the doubles, and a planned one-tile job."""

    ctx: TileContext
    db: FlakyMetadata
    leases: WatchedLeases
    pointers: MemoryPointers
    events: Events
    kernels: HookedKernels
    handing_back: asyncio.Event
    cancelled: set[str]
    job: Job

    def delivery(self, deliveries: int = 1, tile_index: int = 0) -> FakeDelivery:
        return FakeDelivery(TileMessage(self.job.job_id, tile_index).encode(), deliveries)

    async def run(self, delivery: FakeDelivery | None = None) -> tuple[TileRun, FakeDelivery]:
        d = delivery or self.delivery()
        tile_run = TileRun(self.ctx, d)
        await asyncio.wait_for(tile_run.run(), 60)
        return tile_run, d

    async def tile_state(self) -> TileState:
        tile = await self.db.get_tile(self.job.job_id, 0)
        assert tile is not None
        return tile.state

    async def outcomes(self) -> list[AttemptOutcome | None]:
        return [a.outcome for a in await self.db.attempts(self.job.job_id)]

    def count(self, name: str, **labels: str) -> float:
        return self.ctx.metrics.registry.get_sample_value(name, labels) or 0.0

    def lease_key(self) -> str:
        return n.lease_key_tile(self.job.job_id, 0)


async def _rig(
    tmp_path: Path, scene: dict[str, object] | None = None, spp: int = SPP, tiles: int = 1
) -> Rig:
    db, leases, pointers, events = FlakyMetadata(), WatchedLeases(), MemoryPointers(), Events()
    doc = kernel.builtin_scene("spheres") if scene is None else scene
    new = make_new_job(width=8 * tiles, height=8, tile_size=8, spp=spp, scene=doc)
    job = (await db.submit_job(new)).job
    await db.plan_tiles(job.job_id, [(8 * i, 0, 8 * i + 8, 8) for i in range(tiles)])
    kernels, handing_back, cancelled = HookedKernels(), asyncio.Event(), set[str]()
    worker = WorkerSettings(samples_per_pass=1, pass_seconds=0.0, checkpoint_interval=3600.0)
    ctx = TileContext(
        db=db,
        leases=leases,
        progress=pointers,
        store=await DirectoryStore.open(tmp_path / "objects"),
        events=events,
        jobs=JobCache(db, 8),
        scenes=SceneCache(),
        renderers={kernels.name: kernels},
        stop=StopView(handing_back, cancelled),
        metrics=Metrics(),
        lease_config=LeaseSettings(ttl=10, heartbeat_interval=0.05),
        worker_config=worker,
        retry=RetryPolicy(base=1.0, cap=8.0, jitter=0.0),
        node="unit",
        log=Log("test.tile_run"),
        turns=RunTurns(1),
    )
    return Rig(ctx, db, leases, pointers, events, kernels, handing_back, cancelled, job)


@pytest.fixture(scope="module", autouse=True)
def _warm_kernel() -> None:
    """The kernel's first call in a process loads its compiled code. A test run alone would
    otherwise measure that load as its first pass, and size its later passes by it."""
    settings = kernel.RenderSettings(width=8, height=8, spp=1)
    prepared = kernel.prepare(kernel.builtin_scene("spheres"), 0, settings)
    rect = Rect(0, 0, 8, 8)
    kernel.render_tile(prepared, rect, 0, 1, np.zeros((8, 8, 3)))


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    return await _rig(tmp_path)


async def test_finished_commits_then_acks(rig: Rig):
    tile_run, d = await rig.run()
    assert d.settled == "ack"
    assert await rig.tile_state() is TileState.DONE
    assert await rig.outcomes() == [AttemptOutcome.DONE]
    ((done, fence),) = rig.events.done
    assert (done.job_id, done.tile_index, done.attempt_id) == (
        rig.job.job_id,
        0,
        tile_run.attempt_id,
    )
    assert fence == tile_run.token
    # the attempt records what its passes took on the kernel threads (the cost of a sample)
    (attempt,) = await rig.db.attempts(rig.job.job_id)
    assert len(rig.kernels.took) == SPP and all(s > 0 for s in rig.kernels.took)
    assert attempt.render_seconds == sum(rig.kernels.took)
    # The commit fences every later write, so the lease is left to its TTL, not released,
    # and the ack is not waited for (the commit is the record).
    held = await rig.leases.holder(rig.lease_key())
    assert held is not None and held[0].attempt_id == tile_run.attempt_id
    assert d.confirmed is False
    assert rig.count("tessera_tiles_completed_total") == 1
    # its only tile: this commit completes the job, and the worker says so
    assert rig.events.all_done == [TilesDone(rig.job.job_id, tile_run.token)]


async def test_only_the_commit_that_completes_the_job_announces_tiles_done(tmp_path: Path):
    rig = await _rig(tmp_path, tiles=2)
    second, _ = await rig.run(rig.delivery(tile_index=1))
    assert len(rig.events.done) == 1 and rig.events.all_done == [], "tile 0 still open"
    first, _ = await rig.run(rig.delivery(tile_index=0))
    assert first.token is not None and second.token is not None
    assert rig.events.all_done == [TilesDone(rig.job.job_id, max(first.token, second.token))]


async def _held_in_its_pass(
    rig: Rig, tile_index: int
) -> tuple[asyncio.Task[None], asyncio.Event, FakeDelivery]:
    """A run of tile ``tile_index`` started and held after its first pass until the event."""
    go, held = asyncio.Event(), asyncio.Event()

    async def hold(end: int) -> None:
        held.set()
        await go.wait()

    rig.kernels.after_pass = hold
    delivery = rig.delivery(tile_index=tile_index)
    task = asyncio.create_task(asyncio.wait_for(TileRun(rig.ctx, delivery).run(), 60))
    await asyncio.wait_for(held.wait(), 30)
    rig.kernels.after_pass = None  # the held run keeps waiting in its own call
    return task, go, delivery


async def test_a_commit_leaves_the_completion_question_to_a_run_that_owns_a_tile_of_its_job(
    tmp_path: Path,
):
    """Tile 1 commits while tile 0's run owns its tile mid-render: it does not ask (tile 0 is
    not done) and is acked; tile 0's commit, after it, asks once for both: one question and
    one tiles-done for the job."""
    rig = await _rig(tmp_path, spp=2, tiles=2)
    task, go, d0 = await _held_in_its_pass(rig, 0)
    assert rig.ctx.questions.owners(rig.job.job_id) == 1, "fenced: it owns its tile"
    first, d1 = await rig.run(rig.delivery(tile_index=1))
    assert d1.settled == "ack" and first.deferred
    assert rig.db.questions == 0 and rig.events.all_done == []
    go.set()
    await task
    assert d0.settled == "ack" and rig.db.questions == 1
    tokens = [t.lease_fence for t in await rig.db.list_tiles(rig.job.job_id)]
    assert rig.events.all_done == [TilesDone(rig.job.job_id, max(tokens))]
    assert rig.ctx.questions.owners(rig.job.job_id) == 0


async def test_a_question_left_to_an_owner_that_lets_its_tile_go_is_asked_by_the_next_commit(
    tmp_path: Path,
):
    """The run the question was left to fails to commit (the database went away: retried).
    It asks nothing; its tile is not done, so the job is not complete, and the retry's
    commit — after the deferred one — asks and announces the completion."""
    rig = await _rig(tmp_path, spp=2, tiles=2)
    task, go, d0 = await _held_in_its_pass(rig, 0)
    first, _ = await rig.run(rig.delivery(tile_index=1))
    assert first.deferred and rig.db.questions == 0
    rig.db.commit_error = StoreUnavailable("the database went away")
    go.set()
    await task
    assert d0.settled == "nak" and rig.db.questions == 0 and rig.events.all_done == []
    assert rig.ctx.questions.owners(rig.job.job_id) == 0, "let go: no longer an owner"
    retry, d = await rig.run(rig.delivery(deliveries=2, tile_index=0))
    assert d.settled == "ack" and not retry.deferred and rig.db.questions == 1
    tokens = [t.lease_fence for t in await rig.db.list_tiles(rig.job.job_id)]
    assert rig.events.all_done == [TilesDone(rig.job.job_id, max(tokens))]


async def test_a_tile_of_a_job_the_worker_has_measured_starts_with_a_sized_pass(tmp_path: Path):
    rig = await _rig(tmp_path, spp=8, tiles=2)
    adaptive = WorkerSettings(samples_per_pass=1, pass_seconds=0.5, checkpoint_interval=3600.0)
    rig = dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, worker_config=adaptive))
    await rig.run(rig.delivery(tile_index=0))
    assert rig.kernels.ran[0] == (0, 1), "the job's rate unknown: samples_per_pass first"
    first_tile = len(rig.kernels.ran)
    assert rig.ctx.rates.get(rig.job.job_id) is not None, "its passes measured the job"
    await rig.run(rig.delivery(tile_index=1))
    # 8 samples of 64 pixels take well under pass_seconds: the whole tile in one pass
    assert rig.kernels.ran[first_tile:] == [(0, 8)]


class _Clock:
    """``time`` for the render loop, whose monotonic clock a test can move ahead."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


async def test_a_pass_is_sized_by_what_it_took_on_the_renderer_not_by_its_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tile started before its job's rate was known waits in line behind the other tiles in
    hand: its 4-sample first pass ends seconds after it began. The next pass is sized by the
    pass's own seconds on the renderer, so the tile is done in one more pass, not in passes
    of 4 that keep it (and its lease) in flight for the whole job."""
    from services.worker import render

    clock = _Clock()
    monkeypatch.setattr(render, "time", clock)
    rig = await _rig(tmp_path, spp=64)
    adaptive = WorkerSettings(samples_per_pass=4, pass_seconds=0.5, checkpoint_interval=3600.0)
    rig = dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, worker_config=adaptive))

    async def waited_in_line(end: int) -> None:
        clock.ahead += 2.0  # four times pass_seconds went by on the loop's clock

    rig.kernels.after_pass = waited_in_line
    _, d = await rig.run()
    assert d.settled == "ack"
    assert sum(rig.kernels.took) < 0.5, "8x8 pixels of 64 samples: well under a pass"
    assert rig.kernels.ran == [(0, 4), (4, 64)], "at most 16 times the first pass, then the rest"


async def test_a_result_object_is_written_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result an OS crash loses fails its sha256 at finalization and is rendered again, so
    the worker does not pay two fsyncs per tile for it (docs/architecture.md, step 6)."""
    rig = await _rig(tmp_path)
    as_object = dataclasses.replace(rig.ctx.worker_config, inline_result_bytes=0)
    rig = dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, worker_config=as_object))
    synced = list[int]()
    monkeypatch.setattr(os, "fsync", synced.append)
    _, d = await rig.run()
    assert d.settled == "ack"
    tile = await rig.db.get_tile(rig.job.job_id, 0)
    assert tile is not None and tile.result_key is not None, "the result is an object"
    assert await rig.ctx.store.get(tile.result_key, sha256=tile.result_sha256)
    assert synced == []


async def test_a_failed_attempt_still_releases_its_lease(rig: Rig):
    """Only the committed tile keeps its lease until the TTL: every other end gives it up, so
    the next attempt need not wait a TTL."""

    async def fail(end: int) -> None:
        raise RetryableError("transient")

    rig.kernels.after_pass = fail
    _, d = await rig.run()
    assert d.settled == "nak" and d.confirmed is None
    assert await rig.leases.holder(rig.lease_key()) is None


async def test_lease_lost_settles_nothing(rig: Rig):
    async def lose(end: int) -> None:
        rig.leases.expire(rig.lease_key())
        await asyncio.wait_for(rig.leases.refused.wait(), 10)  # the heartbeat saw it

    rig.kernels.after_pass = lose
    _, d = await rig.run()
    assert d.settled is None, "the new owner holds the message's fate"
    assert await rig.outcomes() == [AttemptOutcome.LEASE_LOST]
    assert await rig.tile_state() is TileState.LEASED and rig.events.done == []
    assert rig.count("tessera_lease_renewal_failures_total", kind="tile") == 1
    assert rig.count("tessera_tiles_completed_total") == 0


async def test_cancel_acks_with_the_attempt_ended(rig: Rig):
    async def cancel(end: int) -> None:
        await rig.db.request_cancel(rig.job.job_id)
        rig.cancelled.add(rig.job.job_id)  # the job-cancelled event arrived

    rig.kernels.after_pass = cancel
    _, d = await rig.run()
    assert d.settled == "ack"
    assert await rig.tile_state() is TileState.CANCELLED
    assert await rig.outcomes() == [AttemptOutcome.CANCELLED]
    assert await rig.leases.holder(rig.lease_key()) is None and rig.events.done == []


async def test_hand_back_checkpoints_and_naks_at_once(rig: Rig):
    async def drain(end: int) -> None:
        rig.handing_back.set()

    rig.kernels.after_pass = drain
    tile_run, d = await rig.run()
    assert (d.settled, d.delay) == ("nak", None), "handed back: redelivered at once"
    found = await rig.pointers.get(n.progress_key(rig.job.job_id, 0))
    assert found is not None and found[0].samples_done == 1, "the pass done is kept"
    assert found[0].attempt_id == tile_run.attempt_id
    tile = await rig.db.get_tile(rig.job.job_id, 0)
    assert tile is not None and (tile.state, tile.samples_done) == (TileState.PROGRESSING, 1)
    assert await rig.outcomes() == [AttemptOutcome.HANDED_BACK]
    assert await rig.leases.holder(rig.lease_key()) is None

    rig.handing_back.clear()
    rig.kernels.after_pass = None
    again, d2 = await rig.run()  # the next delivery resumes from the checkpoint
    assert d2.settled == "ack" and again.resumed_from == 1
    assert await rig.tile_state() is TileState.DONE


async def _newer_owner(rig: Rig, *, commit: bool) -> int:
    """Another worker takes the tile over (the lease expired) and, if ``commit``, commits."""
    rig.leases.expire(rig.lease_key())
    lease = await rig.leases.acquire(rig.lease_key(), LeaseOwner("other", "theirs"))
    assert lease is not None
    job_id = rig.job.job_id
    assert await rig.db.fence_tile(job_id, 0, token=lease.token, attempt_id="theirs", node="other")
    if commit:
        done = TileCommit(job_id, 0, token=lease.token, attempt_id="theirs", result_key="r/theirs",
                          result_sha256="cd" * 32, samples_done=SPP, node="other")  # fmt: skip
        assert await rig.db.commit_tile(done) is CommitOutcome.COMMITTED
    return lease.token


async def test_a_commit_refused_by_the_fence_is_counted_not_completed(rig: Rig):
    async def take_over(end: int) -> None:
        if end == SPP:  # after the last pass: the render finishes, the commit is refused
            await _newer_owner(rig, commit=False)

    rig.kernels.after_pass = take_over
    tile_run, d = await rig.run()
    assert d.settled is None, "fenced: the newer owner holds the message's fate"
    assert rig.count("tessera_tile_commits_refused_total", reason="fenced") == 1
    assert rig.count("tessera_tiles_completed_total") == 0 and tile_run.committed is None
    outcomes = {a.attempt_id: a.outcome for a in await rig.db.attempts(rig.job.job_id)}
    assert outcomes == {tile_run.attempt_id: AttemptOutcome.FENCED, "theirs": None}
    assert await rig.tile_state() is TileState.LEASED and rig.events.done == []


async def test_a_commit_refused_as_already_done_announces_theirs_and_acks(rig: Rig):
    theirs: list[int] = []

    async def beaten(end: int) -> None:
        if end == SPP:
            theirs.append(await _newer_owner(rig, commit=True))

    rig.kernels.after_pass = beaten
    tile_run, d = await rig.run()
    assert d.settled == "ack"
    assert rig.count("tessera_tile_commits_refused_total", reason="already_done") == 1
    assert rig.count("tessera_tiles_completed_total") == 0 and tile_run.committed is None
    ((done, fence),) = rig.events.done
    assert (done.result_key, fence) == ("r/theirs", theirs[0]), "their result, announced again"
    tile = await rig.db.get_tile(rig.job.job_id, 0)
    assert tile is not None and tile.result_key == "r/theirs"


async def test_a_terminal_error_is_dead_lettered_with_tile_and_job_failed(tmp_path: Path):
    rig = await _rig(tmp_path, scene={"spheres": "not a list"})  # the kernel rejects it
    _, d = await rig.run()
    assert d.settled == "term"
    (letter,) = d.letters
    assert (letter.job_id, letter.unit, letter.error.code) == (
        rig.job.job_id, n.dlq_unit_tile(0), "kernel_failure",
    )  # fmt: skip
    assert await rig.tile_state() is TileState.FAILED_TERMINAL
    assert await rig.outcomes() == [AttemptOutcome.TERMINAL]
    assert rig.events.failed == [(rig.job.job_id, "kernel_failure")]


async def test_an_undecodable_message_is_dead_lettered_under_the_job_unit(rig: Rig):
    _, d = await rig.run(FakeDelivery(b"\xff garbage", subject="t9.tessera.tiles.job-7.3"))
    assert d.settled == "term"
    (letter,) = d.letters
    assert (letter.job_id, letter.unit, letter.record) == ("job-7", n.DLQ_UNIT_JOB, None)


async def test_a_retryable_error_naks_with_backoff_and_records_the_failure(rig: Rig):
    rig.db.commit_error = StoreUnavailable("the database went away")
    _, d = await rig.run(rig.delivery(deliveries=3))
    assert (d.settled, d.delay) == ("nak", 4.0), "backoff(base 1, cap 8, no jitter) of try 3"
    assert await rig.tile_state() is TileState.FAILED_RETRYABLE
    assert await rig.outcomes() == [AttemptOutcome.RETRYABLE]
    assert rig.count("tessera_retries_total", code="unavailable") == 1
    assert await rig.leases.holder(rig.lease_key()) is None


async def test_a_lease_held_elsewhere_retries_after_a_ttl_without_working(rig: Rig):
    assert await rig.leases.acquire(rig.lease_key(), LeaseOwner("other", "theirs"))
    _, d = await rig.run()
    assert (d.settled, d.delay) == ("nak", 10.0)
    assert await rig.tile_state() is TileState.QUEUED and await rig.outcomes() == []


async def test_a_done_tile_is_announced_again_and_acked(rig: Rig):
    first, _ = await rig.run()
    again, d = await rig.run()
    assert d.settled == "ack" and again.token is None, "nothing leased the second time"
    assert [fence for _, fence in rig.events.done] == [first.token, first.token]
    # a redelivery (the worker died before tiles-done went out) announces the completion again,
    # under the same id, so nothing but this copy finalizes the job and a repeat is absorbed
    assert first.token is not None
    assert rig.events.all_done == [TilesDone(rig.job.job_id, first.token)] * 2


async def test_a_done_tile_whose_lease_expired_is_announced_and_its_new_lease_released(rig: Rig):
    """Past the committer's lease TTL a copy takes the lease: the fence's statement finds the
    tile done (nothing written), the copy re-announces it and gives the lease back."""
    first, _ = await rig.run()
    rig.leases.expire(rig.lease_key())
    before = await rig.db.get_tile(rig.job.job_id, 0)
    again, d = await rig.run()
    assert d.settled == "ack" and again.token is None, "nothing fenced the second time"
    assert [fence for _, fence in rig.events.done] == [first.token, first.token]
    assert await rig.leases.holder(rig.lease_key()) is None, "the copy's lease was released"
    assert await rig.db.get_tile(rig.job.job_id, 0) == before, "the row as it was"
    assert [a.attempt_id for a in await rig.db.attempts(rig.job.job_id)] == [first.attempt_id]


async def test_the_heartbeat_extends_the_delivery(rig: Rig):
    async def hold(end: int) -> None:
        if end == 1:
            await eventually(lambda: d.in_progress_calls >= 2, what="two heartbeats")

    d = rig.delivery()
    rig.kernels.after_pass = hold
    await rig.run(d)
    assert d.settled == "ack"


async def test_a_checkpoint_of_another_renderer_version_is_not_resumed(rig: Rig):
    """The pointer's hash covers the renderer's name and version: after the renderer changes
    version (an upgraded Blender, a new kernel), the tile starts over instead of resuming."""

    async def drain(end: int) -> None:
        rig.handing_back.set()

    rig.kernels.after_pass = drain
    await rig.run()  # one pass, checkpointed, handed back
    found = await rig.pointers.get(n.progress_key(rig.job.job_id, 0))
    assert found is not None and found[0].samples_done == 1
    rig.handing_back.clear()
    rig.kernels.after_pass = None
    rig.kernels.version = "2.0.0"  # the same renderer, another version
    again, d2 = await rig.run()
    assert d2.settled == "ack" and again.resumed_from == 0, "started over"
    assert await rig.tile_state() is TileState.DONE


class Planned(HookedKernels):
    """The kernel under a fixed pass plan (as Blender's); ``ran`` records its passes."""

    def __init__(self, plan: tuple[int, ...]) -> None:
        super().__init__()
        self.plan = plan

    def passes(self, job: Job) -> tuple[int, ...]:
        return self.plan


@pytest.mark.parametrize("later_plan", [(3, 4), (2, 4)])
async def test_a_fixed_pass_plan_is_followed_and_an_off_plan_checkpoint_dropped(
    tmp_path: Path, later_plan: tuple[int, int]
) -> None:
    rig = await _rig(tmp_path, spp=4)
    planned = Planned((3, 4))
    rig.ctx = dataclasses.replace(rig.ctx, renderers={planned.name: planned})

    async def drain(end: int) -> None:
        rig.handing_back.set()

    planned.after_pass = drain
    await rig.run()
    assert planned.ran == [(0, 3)], "the plan's first pass, not samples_per_pass"
    rig.handing_back.clear()
    planned.after_pass, planned.plan = None, later_plan
    again, d = await rig.run()
    assert d.settled == "ack" and await rig.tile_state() is TileState.DONE
    if later_plan == (3, 4):
        assert again.resumed_from == 3 and planned.ran == [(0, 3), (3, 4)]
    else:  # 3 samples end no pass of the plan now: not resumed
        assert again.resumed_from == 0 and planned.ran == [(0, 3), (0, 2), (2, 4)]


class Interruptible(HookedKernels):
    """The kernel as an interruptible renderer (like Blender): its second pass never ends
    unless cancelled, and writes garbage into the accumulator it was given before blocking."""

    interruptible = True

    def __init__(self) -> None:
        super().__init__()
        self.blocked = asyncio.Event()
        self.cancelled = 0

    async def render(
        self, prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        if start == 0:
            return await super().render(prepared, rect, start, end, acc)
        acc += 1e6  # a partial pass: must never reach the tile's accumulator
        self.blocked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("a pass nothing wakes returned")


async def _mid_pass(tmp_path: Path) -> tuple[Rig, Interruptible]:
    rig = await _rig(tmp_path)
    renderer = Interruptible()
    rig.ctx = dataclasses.replace(rig.ctx, renderers={renderer.name: renderer})
    return rig, renderer


async def _when_blocked(renderer: Interruptible, then: Callable[[], Awaitable[None]]) -> None:
    await asyncio.wait_for(renderer.blocked.wait(), 30)
    await then()


@pytest.mark.parametrize("signal", ["drain", "cancel", "pause", "lease_lost"])
async def test_a_pass_that_can_be_interrupted_is_cancelled_mid_way(
    tmp_path: Path, signal: str
) -> None:
    """Drain, cancel, pause and lease loss cancel a pass of an interruptible renderer while it
    runs (it would never end otherwise); its partial samples are discarded."""
    rig, renderer = await _mid_pass(tmp_path)
    job_id = rig.job.job_id

    async def fire() -> None:
        if signal == "drain":
            rig.handing_back.set()
        elif signal == "cancel":
            await rig.db.request_cancel(job_id)
            rig.cancelled.add(job_id)
            rig.ctx.stop.wakers.wake(job_id)
        elif signal == "pause":
            await rig.db.transition_job(job_id, JobTrigger.PAUSE)
            assert isinstance(rig.ctx.stop.changed, dict)
            rig.ctx.stop.changed[job_id] = time.monotonic()
            rig.ctx.stop.wakers.wake(job_id)
        else:
            rig.leases.expire(rig.lease_key())

    trigger = asyncio.create_task(_when_blocked(renderer, fire))
    _, d = await rig.run()
    await trigger
    assert renderer.cancelled == 1, "the pass was cancelled, not awaited to its end"
    assert rig.ctx.stop.wakers.watching(job_id) == 0
    outcomes = await rig.outcomes()
    if signal == "drain":
        assert (d.settled, outcomes) == ("nak", [AttemptOutcome.HANDED_BACK])
    elif signal == "cancel":
        assert (d.settled, outcomes) == ("ack", [AttemptOutcome.CANCELLED])
    elif signal == "pause":
        assert (d.settled, outcomes) == ("ack", [AttemptOutcome.PAUSED])
    else:
        assert (d.settled, outcomes) == (None, [AttemptOutcome.LEASE_LOST])
    found = await rig.pointers.get(n.progress_key(job_id, 0))
    if signal in ("drain", "pause"):  # checkpointed at the pass's start
        assert found is not None and found[0].samples_done == 1
    if signal == "drain":  # resumed: the result equals an uninterrupted render's, bit for bit
        plain = HookedKernels()
        rig.ctx = dataclasses.replace(rig.ctx, renderers={plain.name: plain})
        rig.handing_back.clear()
        again, d2 = await rig.run()
        assert d2.settled == "ack" and again.resumed_from == 1
        reference = await _rig(tmp_path / "reference")
        await reference.run()
        ours, theirs = (
            await rig.db.get_tile(job_id, 0),
            await reference.db.get_tile(reference.job.job_id, 0),
        )
        assert ours is not None and theirs is not None
        assert ours.result_sha256 == theirs.result_sha256, "the partial pass left no trace"


async def test_a_superseded_generation_is_dropped_and_the_current_one_renders(rig: Rig):
    """Released again (generation 1) after a message of generation 0 went out: the old copy's
    fence writes nothing, it is acked with its lease released and no attempt; the current one
    renders."""
    released = await rig.db.release_tiles({"tessera": 1}, limit=1, usage_window=300)
    assert [t.generation for t in released.tiles] == [1]
    old, d = await rig.run(FakeDelivery(TileMessage(rig.job.job_id, 0, 0).encode()))
    assert d.settled == "ack" and old.token is None, "nothing fenced for a superseded message"
    assert await rig.outcomes() == [] and await rig.tile_state() is TileState.QUEUED
    assert await rig.leases.holder(rig.lease_key()) is None, "its lease given back at once"
    assert rig.count("tessera_superseded_messages_total") == 1
    _, current = await rig.run(FakeDelivery(TileMessage(rig.job.job_id, 0, 1).encode()))
    assert current.settled == "ack" and await rig.tile_state() is TileState.DONE


async def test_a_run_whose_lease_is_lost_owns_nothing_and_the_commit_asks(tmp_path: Path):
    """Tile 0's run is mid-render when its heartbeat finds its lease gone (another worker may
    take the tile and commit it before tile 1's commit): tile 1's commit does not leave the
    question to it but asks at once."""
    rig = await _rig(tmp_path, spp=2, tiles=2)
    task, go, d0 = await _held_in_its_pass(rig, 0)
    rig.leases.expire(n.lease_key_tile(rig.job.job_id, 0))
    await asyncio.wait_for(rig.leases.refused.wait(), 10)  # its heartbeat saw it
    assert rig.ctx.questions.owners(rig.job.job_id) == 0
    first, _ = await rig.run(rig.delivery(tile_index=1))
    assert not first.deferred and rig.db.questions == 1
    go.set()
    await task
    assert d0.settled is None, "the next owner holds the message's fate"


def test_a_commit_defers_only_while_another_run_owns_a_tile_of_its_job() -> None:
    q = Questions()
    assert not q.defer("j"), "no owner: ask now"
    mine, theirs, lost, other = (asyncio.Event() for _ in range(4))
    q.own("j", mine)
    q.own("j", theirs)
    q.own("j", lost)
    q.own("other", other)
    q.disown("j", mine)  # committed
    assert q.defer("j") and q.owners("j") == 2 and not q.defer("third")
    lost.set()  # its heartbeat lost the lease: no longer an owner, at once
    assert q.owners("j") == 1
    q.disown("j", theirs)
    assert not q.defer("j") and q.owners("other") == 1
    q.disown("j", lost)
    assert q.owners("j") == 0


async def test_declined_fences_of_a_job_wait_for_one_transaction_then_take_the_plain_statement(
    tmp_path: Path,
):
    """Three tiles of a job TILE_STARTED still moves reach the fence together: the plain
    statement declines all three; one run (the mover) takes the transaction, which moves the
    job; the other two wait for it, ask the plain statement again and are fenced by it: one
    transaction, not three (services/worker/context.py, ``JobMoves``)."""
    rig = await _rig(tmp_path, tiles=3)
    assert rig.job.state is not JobState.PROGRESSING, "the first TILE_STARTED moves the job"
    plain, transactions = rig.db.fence_first, rig.db.fence_tile
    declined: list[int] = []
    all_declined = asyncio.Event()
    fenced_by: list[str] = []
    in_plain = contextvars.ContextVar("in_plain", default=False)  # (the double's own call)

    async def fence_first(job_id: str, tile_index: int, **kw: Any) -> FirstFence:
        token = in_plain.set(True)
        try:
            first = await plain(job_id, tile_index, **kw)
        finally:
            in_plain.reset(token)
        if first.fenced:
            fenced_by.append("statement")
        else:
            declined.append(tile_index)
            if len(declined) == 3:
                all_declined.set()
        return first

    async def fence_tile(job_id: str, tile_index: int, **kw: Any) -> bool:
        if not in_plain.get():
            await all_declined.wait()  # (the transaction waits until every run is declined)
            fenced_by.append("transaction")
        return await transactions(job_id, tile_index, **kw)

    rig.db.fence_first = fence_first  # type: ignore[method-assign]
    rig.db.fence_tile = fence_tile  # type: ignore[method-assign]
    runs = [rig.run(rig.delivery(tile_index=i)) for i in range(3)]
    settled = await asyncio.wait_for(asyncio.gather(*runs), 60)
    assert [d.settled for _, d in settled] == ["ack"] * 3
    assert sorted(declined) == [0, 1, 2]
    assert sorted(fenced_by) == ["statement", "statement", "transaction"]
    assert [t.state for t in await rig.db.list_tiles(rig.job.job_id)] == [TileState.DONE] * 3
