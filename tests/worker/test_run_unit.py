"""A run of tiles in one TILES message (:mod:`services.worker.run`), on the doubles of
:mod:`tests.worker.test_tile_run_unit` with the real kernel: every tile of the run goes through
its own steps, and the message is settled once, by the combined outcome
(:func:`shared.service.settle.combine`, whose order is checked here too)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from pathlib import Path

import pytest

import kernel
from kernel.rect import Rect
from proto import names as n
from proto.messages import TileMessage, TilesDone
from services.worker import run
from services.worker.context import Result, RunCommits, RunTurns
from services.worker.tile import TileRun
from shared.core.errors import DecodeError, RetryableError, StoreUnavailable, TerminalError
from shared.core.lifecycle import TileState
from shared.core.tiles import Accumulator
from shared.metadata import AttemptOutcome, CommitOutcome, TileCommit
from shared.nats.leases import LeaseOwner
from shared.service.settle import (
    ACK,
    ACK_RECORDED,
    HAND_BACK,
    DeadLetter,
    Leave,
    Outcome,
    Retry,
    combine,
)
from tests.doubles.delivery import FakeDelivery
from tests.helpers import eventually
from tests.worker.test_tile_run_unit import SPP, Rig, _rig

TILES = 4


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    return await _rig(tmp_path, tiles=TILES)


def _run_of(rig: Rig, first: int = 0, length: int = TILES, deliveries: int = 1) -> FakeDelivery:
    message = TileMessage(rig.job.job_id, first, 0, length)
    return FakeDelivery(message.encode(), deliveries)


async def _handle(rig: Rig, d: FakeDelivery) -> FakeDelivery:
    await asyncio.wait_for(run.handle(rig.ctx, d), 60)
    return d


async def _states(rig: Rig) -> list[TileState]:
    return [t.state for t in await rig.db.list_tiles(rig.job.job_id)]


async def test_a_run_renders_each_tile_under_its_own_lease_and_acks_once(rig: Rig) -> None:
    d = await _handle(rig, _run_of(rig))
    assert (d.settled, d.confirmed) == ("ack", False), "every tile committed: the record"
    assert await _states(rig) == [TileState.DONE] * TILES
    attempts = await rig.db.attempts(rig.job.job_id)
    assert sorted(a.tile_index or 0 for a in attempts) == list(range(TILES))
    assert {a.outcome for a in attempts} == {AttemptOutcome.DONE}
    # one lease per tile, each its own token, each the fence of its tile's commit
    fences = {t.tile_index: t.lease_fence for t in await rig.db.list_tiles(rig.job.job_id)}
    assert len(set(fences.values())) == TILES
    assert sorted((done.tile_index, fence) for done, fence in rig.events.done) == sorted(
        fences.items()
    )
    by_tile = {a.tile_index: a.attempt_id for a in attempts}
    for i in range(TILES):  # left to their TTL, each held by its own tile's attempt
        held = await rig.leases.holder(n.lease_key_tile(rig.job.job_id, i))
        assert held is not None and held[0].attempt_id == by_tile[i]
    assert rig.events.all_done == [TilesDone(rig.job.job_id, max(fences.values()))]
    assert rig.count("tessera_tiles_completed_total") == TILES


async def test_a_runs_tiles_commit_together_once_none_is_still_rendering(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tile 2 is held after its first pass: the other three finish rendering and wait, their
    results uncommitted, and all four commit once it is done (one statement on PostgreSQL,
    through the store's group commit)."""
    go, held = asyncio.Event(), asyncio.Event()
    render = rig.kernels.render

    async def third_tile_slow(
        prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        seconds = await render(prepared, rect, start, end, acc)
        if rect.x0 == 16 and end == 1:  # tile 2's first pass (of SPP = 2)
            held.set()
            await go.wait()
        return seconds

    committed: list[int] = []
    commit = rig.db.commit_tile

    async def recorded(done: TileCommit) -> CommitOutcome:
        committed.append(done.tile_index)
        return await commit(done)

    monkeypatch.setattr(rig.kernels, "render", third_tile_slow)
    monkeypatch.setattr(rig.db, "commit_tile", recorded)
    task = asyncio.create_task(_handle(rig, _run_of(rig)))
    await asyncio.wait_for(held.wait(), 30)
    await eventually(
        lambda: [end for _, end in rig.kernels.ran].count(SPP) == TILES - 1,
        what="the three other tiles rendered",
        timeout=30,
    )
    assert committed == [], "rendered, not committed while a tile of the run still renders"
    assert await _states(rig) == [TileState.LEASED] * TILES
    go.set()
    d = await asyncio.wait_for(task, 60)
    assert d.settled == "ack" and sorted(committed) == list(range(TILES))
    assert await _states(rig) == [TileState.DONE] * TILES
    assert rig.events.all_done != [], "the job's completion announced once they all committed"


def _as_objects(rig: Rig) -> Rig:
    """The rig with every result written as an object (its 8x8 results would go inline)."""
    config = dataclasses.replace(rig.ctx.worker_config, inline_result_bytes=0)
    return dataclasses.replace(rig, ctx=dataclasses.replace(rig.ctx, worker_config=config))


async def test_a_runs_results_are_written_in_one_call_before_any_commit(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker flow step 6 for a run: once none of its tiles still renders, the run's results
    are written in one call (not made durable), then committed; no result is written alone."""
    rig = _as_objects(rig)
    committed: list[int] = []
    commit = rig.db.commit_tile

    async def recorded(done: TileCommit) -> CommitOutcome:
        committed.append(done.tile_index)
        return await commit(done)

    writes: list[tuple[list[str], list[int], bool]] = []
    put_many = rig.ctx.store.put_many

    async def many(items: list[tuple[str, bytes, str]], *, durable: bool = True) -> None:
        writes.append((sorted(key for key, _, _ in items), list(committed), durable))
        await put_many(items, durable=durable)

    async def alone(*args: object, **kwargs: object) -> str:
        raise AssertionError("a result of a run written alone")

    monkeypatch.setattr(rig.db, "commit_tile", recorded)
    monkeypatch.setattr(rig.ctx.store, "put_many", many)
    monkeypatch.setattr(rig.ctx.store, "put", alone)
    d = await _handle(rig, _run_of(rig))
    assert d.settled == "ack" and sorted(committed) == list(range(TILES))
    tiles = await rig.db.list_tiles(rig.job.job_id)
    keys = sorted(t.result_key or "" for t in tiles)
    assert writes == [(keys, [], False)], "one write of the four, before any commit"
    monkeypatch.undo()
    for t in tiles:
        assert t.result_key is not None and t.result_sha256 is not None
        assert await rig.ctx.store.get(t.result_key, sha256=t.result_sha256)


async def test_a_failed_write_of_a_runs_results_commits_none_and_retries_the_run(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is unavailable when the run's results are written: every tile fails as
    retryable, nothing is committed, and the message comes back after its backoff."""
    rig = _as_objects(rig)

    async def down(items: list[tuple[str, bytes, str]], *, durable: bool = True) -> None:
        raise StoreUnavailable("the object store went away")

    monkeypatch.setattr(rig.ctx.store, "put_many", down)
    d = await _handle(rig, _run_of(rig))
    assert (d.settled, d.delay) == ("nak", 1.0), "backoff(base 1, no jitter) of the first try"
    assert await _states(rig) == [TileState.FAILED_RETRYABLE] * TILES
    attempts = await rig.db.attempts(rig.job.job_id)
    assert sorted(a.tile_index or 0 for a in attempts) == list(range(TILES))
    assert {a.outcome for a in attempts} == {AttemptOutcome.RETRYABLE}
    assert rig.events.done == [] and rig.count("tessera_tiles_completed_total") == 0


async def test_a_tile_kept_inline_commits_whatever_became_of_the_runs_write() -> None:
    """A run's write fails: the tile whose result was in it fails with that error; a tile whose
    result is kept inline (nothing of it in the write) waited for the write, then goes on."""

    async def down(results: list[Result]) -> None:
        raise StoreUnavailable("the object store went away")

    commits = RunCommits([0, 1], write=down)
    written = asyncio.create_task(commits.rendered(0, ("tiles/j/0/r.npy", b"r", "0" * 64)))
    inline = asyncio.create_task(commits.rendered(1))
    await asyncio.wait_for(inline, 10)
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(written, 10)


async def test_a_failed_write_is_read_when_every_tile_waiting_for_it_was_cancelled() -> None:
    """A drain cancels every tile of a run while its write is under way, and the write then
    fails: the error is read (asyncio reports no "exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    started, go = asyncio.Event(), asyncio.Event()

    async def slow_then_down(results: list[Result]) -> None:
        started.set()
        await go.wait()
        raise StoreUnavailable("the object store went away")

    try:
        commits = RunCommits([0, 1], write=slow_then_down)
        tiles = [
            asyncio.create_task(commits.rendered(i, (f"tiles/j/{i}/r.npy", b"r", "0" * 64)))
            for i in (0, 1)
        ]
        await asyncio.wait_for(started.wait(), 10)
        for tile in tiles:
            tile.cancel()
        await asyncio.wait(tiles, timeout=10)
        assert all(tile.cancelled() for tile in tiles)
        write = commits._written
        assert write is not None
        go.set()
        await asyncio.wait([write], timeout=10)  # (waits without reading its error)
        assert write.done()
        del commits, write, tiles
        gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert reported == []


async def test_a_bug_in_one_tile_does_not_hold_the_runs_other_commits(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tile 2's render raises a bug after its first pass, while the other three wait to
    commit with it: they commit, and the bug leaves the message unsettled (it comes back after
    ack_wait and renders tile 2 again)."""
    render = rig.kernels.render

    async def third_tile_breaks(
        prepared: kernel.Prepared, rect: Rect, start: int, end: int, acc: Accumulator
    ) -> float:
        seconds = await render(prepared, rect, start, end, acc)
        if rect.x0 == 16 and end == 1:
            raise RuntimeError("a bug in tile 2's steps")
        return seconds

    monkeypatch.setattr(rig.kernels, "render", third_tile_breaks)
    d = _run_of(rig)
    with pytest.raises(RuntimeError, match="tile 2"):
        await _handle(rig, d)
    assert d.settled is None
    states = await _states(rig)
    assert states[:2] + states[3:] == [TileState.DONE] * 3 and states[2] is not TileState.DONE


async def test_a_second_run_waits_unleased_for_the_first_and_a_drain_hands_it_back(
    rig: Rig,
) -> None:
    """One kernel thread: the run of tiles 2-3 waits while the run of tiles 0-1 renders (held
    in its first pass), nothing of it leased; the worker's drain hands it back unstarted."""
    go, held = asyncio.Event(), asyncio.Event()

    async def hold(end: int) -> None:
        held.set()
        await go.wait()

    rig.kernels.after_pass = hold
    first = asyncio.create_task(_handle(rig, _run_of(rig, 0, 2)))
    await asyncio.wait_for(held.wait(), 30)
    rig.kernels.after_pass = None
    second = asyncio.create_task(_handle(rig, _run_of(rig, 2, 2)))
    await eventually(lambda: rig.ctx.turns.waiting == 1, timeout=10, what="the second run waiting")
    assert {a.tile_index for a in await rig.db.attempts(rig.job.job_id)} == {0, 1}
    for i in (2, 3):
        assert await rig.leases.holder(n.lease_key_tile(rig.job.job_id, i)) is None
    rig.handing_back.set()
    d = await asyncio.wait_for(second, 10)
    assert (d.settled, d.delay) == ("nak", None), "handed back at once"
    assert {a.tile_index for a in await rig.db.attempts(rig.job.job_id)} == {0, 1}
    go.set()
    await asyncio.wait_for(first, 60)
    assert rig.ctx.turns.started == 0


async def test_a_run_tile_found_done_makes_room_for_the_next_run_at_once(rig: Rig) -> None:
    """The turns count tiles left to render: a run whose tile 1 is done already has one tile
    left while tile 0 renders (held in its pass), so with a lead of one the next run starts
    beside it, its tiles leased and rendering, though the first run holds its turn still."""
    await _handle(rig, FakeDelivery(TileMessage(rig.job.job_id, 1, 0, 1).encode()))
    ctx = dataclasses.replace(rig.ctx, turns=RunTurns(2, lead=1))
    go = asyncio.Event()

    async def hold(end: int) -> None:
        await go.wait()

    rig.kernels.after_pass = hold
    first = asyncio.create_task(asyncio.wait_for(run.handle(ctx, _run_of(rig, 0, 2)), 60))
    await eventually(lambda: ctx.turns.pending == 1, timeout=10, what="tile 1 found done")
    second = asyncio.create_task(asyncio.wait_for(run.handle(ctx, _run_of(rig, 2, 2)), 60))

    async def second_started() -> bool:
        return {2, 3} <= {a.tile_index for a in await rig.db.attempts(rig.job.job_id)}

    await eventually(second_started, timeout=10, what="the next run's tiles leased")
    assert not first.done() and ctx.turns.started == 2 and ctx.turns.waiting == 0
    go.set()
    await asyncio.gather(first, second)
    assert await _states(rig) == [TileState.DONE] * TILES
    assert ctx.turns.started == 0 and ctx.turns.pending == 0


async def test_a_redelivered_run_renders_only_its_tiles_not_done(rig: Rig) -> None:
    await _handle(rig, FakeDelivery(TileMessage(rig.job.job_id, 1, 0, 2).encode()))
    first = {a.tile_index for a in await rig.db.attempts(rig.job.job_id)}
    assert first == {1, 2}
    d = await _handle(rig, _run_of(rig, deliveries=2))
    assert await _states(rig) == [TileState.DONE] * TILES
    attempts = await rig.db.attempts(rig.job.job_id)
    indexes = sorted(a.tile_index or 0 for a in attempts)
    assert indexes == [0, 1, 2, 3], "1 and 2 not rendered again"
    # the done tiles were announced again: an ack the server confirms (nothing was committed
    # for them by this delivery)
    assert (d.settled, d.confirmed) == ("ack", True)
    assert sorted(done.tile_index for done, _ in rig.events.done) == [0, 1, 1, 2, 2, 3]


async def test_a_tile_held_by_another_owner_brings_the_run_back_after_a_ttl(rig: Rig) -> None:
    key = n.lease_key_tile(rig.job.job_id, 2)
    assert await rig.leases.acquire(key, LeaseOwner("other", "theirs"))
    d = await _handle(rig, _run_of(rig))
    assert (d.settled, d.delay) == ("nak", 10.0)
    assert await _states(rig) == [TileState.DONE, TileState.DONE, TileState.QUEUED, TileState.DONE]
    assert rig.count("tessera_tiles_completed_total") == TILES - 1


async def test_a_terminal_tile_dead_letters_the_run_and_records_the_failure(rig: Rig) -> None:
    rig.db.commit_error = DecodeError("a result the store cannot take")  # the first commit only
    d = await _handle(rig, _run_of(rig))
    assert d.settled == "term" and len(d.letters) == 1
    assert d.letters[0].unit.startswith("tile-")
    assert rig.events.failed == [(rig.job.job_id, DecodeError.code)], "recorded before the term"
    assert (await _states(rig)).count(TileState.DONE) == TILES - 1


async def test_garbage_is_dead_lettered_as_before(rig: Rig) -> None:
    d = await _handle(rig, FakeDelivery(b"\x93garbage"))
    assert d.settled == "term" and d.letters[0].unit == n.DLQ_UNIT_JOB


async def test_a_tile_run_handed_a_whole_run_refuses_it_unsettled(rig: Rig) -> None:
    """Only ``run.handle`` splits a run: a TileRun given one (decoding it itself) would settle
    the message for its first tile alone. It raises instead, and leaves the message to come
    back."""
    d = _run_of(rig)
    with pytest.raises(TypeError, match="run of 4 tiles"):
        await asyncio.wait_for(TileRun(rig.ctx, d).run(), 60)
    assert d.settled is None
    assert await rig.db.attempts(rig.job.job_id) == [], "nothing leased, fenced or rendered"
    assert await _states(rig) == [TileState.QUEUED] * TILES


def _letter(name: str, log: list[str]) -> DeadLetter:
    async def record() -> None:
        log.append(name)

    return DeadLetter("j1", f"tile-{name}", TerminalError(name), record)


async def test_combine_orders_the_outcomes_of_a_run() -> None:
    retry_short, retry_long = Retry(1.0, RetryableError("a")), Retry(8.0, RetryableError("b"))
    log: list[str] = []
    cases: list[tuple[list[Outcome], Outcome]] = [
        ([ACK_RECORDED, ACK_RECORDED], ACK_RECORDED),
        ([ACK_RECORDED, ACK], ACK),
        ([ACK, HAND_BACK], HAND_BACK),
        ([HAND_BACK, retry_short, retry_long, ACK], retry_long),
        ([retry_long, Leave("fenced"), ACK], Leave("fenced")),
    ]
    for outcomes, expected in cases:
        assert combine(outcomes) == expected, outcomes
    # a dead letter wins over everything, and runs the record of every dead letter
    letters = [_letter("1", log), _letter("3", log)]
    combined = combine([Leave("lease_lost"), letters[0], retry_long, letters[1]])
    assert isinstance(combined, DeadLetter) and combined.unit == "tile-1"
    assert combined.record is not None
    await combined.record()
    assert log == ["1", "3"]
    only = combine([ACK, DeadLetter("j1", "tile-2", TerminalError("x")), letters[1]])
    assert isinstance(only, DeadLetter) and only.unit == "tile-2"
    assert only.record is letters[1].record
