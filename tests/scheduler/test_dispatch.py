"""The dispatcher against real servers: fair share by weight and usage, a project's cap, two
dispatchers at once, a large job cancelled before release, the live-workers window and its
buffer for short tiles.

No workers render here: the queue is filled with planned jobs and a dispatcher round (with a
fixed window, or the window of workers announced in the real bucket) is called; what it
released is read back from PostgreSQL and TILES.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import asyncpg
import pytest
from nats.aio.msg import Msg

from proto import names as n
from proto.messages import JobMessage, Room, TileMessage
from services.scheduler.dispatch import Dispatcher, backoff_after, idle_wait
from services.scheduler.planner import Planner
from shared.core.config import SchedulerSettings
from shared.core.lifecycle import TileState
from shared.core.window import Window
from shared.metadata import MetadataStore, Tile
from shared.nats.presence import LiveWorkers, WorkerInfo
from shared.service.runtime import Runtime
from tests.helpers import eventually
from tests.metadata.conftest import make_new_job

TILES = 48
"""A 64x48 job with 8-pixel tiles."""


def _with(rt: Runtime, **scheduler: Any) -> Runtime:
    """``rt`` with these scheduler settings changed."""
    changed = dataclasses.replace(rt.settings.scheduler, **scheduler)
    return dataclasses.replace(rt, settings=dataclasses.replace(rt.settings, scheduler=changed))


@pytest.fixture
def runtime(runtime: Runtime) -> Runtime:
    """The window and fair-share tests here count tiles: every tile its own message
    (``TESSERA_DISPATCH_RUN=1``). The tests of runs ask for them (:func:`_runs`)."""
    return _with(runtime, dispatch_run=1)


def _runs(rt: Runtime) -> Runtime:
    """``rt`` with the default runs (``TESSERA_DISPATCH_RUN``, ``TESSERA_DISPATCH_RUN_WORK``)."""
    default = SchedulerSettings()
    return _with(rt, dispatch_run=default.dispatch_run,
                 dispatch_run_work=default.dispatch_run_work)  # fmt: skip


async def _job(rt: Runtime, project: str = "demo", **over: Any) -> str:
    """A submitted job of ``project`` with its 48 tiles planned (unreleased)."""
    defaults: dict[str, Any] = {"tile_size": 8, "spp": 1, "project": project}
    new = make_new_job(**(defaults | over))
    job_id = (await rt.db.submit_job(new)).job.job_id
    await Planner(rt).plan(JobMessage(job_id, 0))
    return job_id


async def _sql(rt: Runtime, query: str, *args: object) -> None:
    conn = await asyncpg.connect(rt.settings.database_url)
    try:
        await conn.execute(query, *args)
    finally:
        await conn.close()


async def _messages(rt: Runtime) -> int:
    """The tiles the TILES messages carry (a run of tiny tiles is one message)."""
    return sum(m.run for m in await _tile_messages(rt))


async def _tile_messages(rt: Runtime) -> list[TileMessage]:
    """Every TILES message, in stream order."""
    stream = rt.names.stream(n.STREAM_TILES)
    info = await rt.js.stream_info(stream)
    return [TileMessage.decode((await rt.js.get_msg(stream, seq)).data or b"")
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
            if info.state.messages]  # fmt: skip


def _by_job(tiles: list[Tile]) -> Counter[str]:
    return Counter(t.job_id for t in tiles)


async def test_weights_split_a_round_two_to_one(runtime: Runtime) -> None:
    await _sql(runtime, "INSERT INTO projects (name, weight) VALUES ('alpha', 2), ('beta', 1)")
    alpha, beta = await _job(runtime, "alpha"), await _job(runtime, "beta")
    released = await Dispatcher(runtime).dispatch_once({"tessera": 12})
    assert _by_job(released) == {alpha: 8, beta: 4}
    assert await _messages(runtime) == 12


async def test_usage_in_the_window_goes_first_to_the_project_that_had_less(
    runtime: Runtime,
) -> None:
    """alpha rendered 100 core-seconds a minute ago (an attempt that failed: no tile-cost
    estimate from it, so one tile is estimated at the default 1 s): beta gets the round."""
    alpha, beta = await _job(runtime, "alpha"), await _job(runtime, "beta")
    await _sql(
        runtime,
        "INSERT INTO attempts (attempt_id, job_id, tile_index, kind, started_at, ended_at, "
        "outcome) VALUES ('old', $1, 47, 'tile', now() - interval '160 s', "
        "now() - interval '60 s', 'retryable')",
        alpha,
    )
    released = await Dispatcher(runtime).dispatch_once({"tessera": 10})
    assert _by_job(released) == {beta: 10}, "beta is 100 core-seconds behind"
    # Over a 30 s window the attempt counts for nothing, and beta's 10 released tiles not yet
    # started count at the estimate: alpha is behind now.
    got = await runtime.db.release_tiles({"tessera": 20}, limit=4, usage_window=30.0)
    assert _by_job(got.tiles) == {alpha: 4}


async def test_a_project_cap_bounds_its_released_and_unfinished_tiles(runtime: Runtime) -> None:
    await _sql(runtime, "INSERT INTO projects (name, weight, max_in_flight) VALUES ('alpha', 5, 3)")
    alpha, beta = await _job(runtime, "alpha", priority=90), await _job(runtime, "beta")
    dispatcher = Dispatcher(runtime)
    assert _by_job(await dispatcher.dispatch_once({"tessera": 10})) == {alpha: 3, beta: 7}
    assert _by_job(await dispatcher.dispatch_once({"tessera": 20})) == {beta: 10}


async def test_two_dispatchers_never_release_a_tile_twice_nor_past_the_window(
    runtime: Runtime,
) -> None:
    """Two stores (two schedulers' pools) releasing at once, many rounds each: every tile is
    released once (generation 1) and the released total never passes the window."""
    jobs = [await _job(runtime, p) for p in ("alpha", "beta", "gamma")]
    other = await MetadataStore.connect(runtime.settings.database_url)
    try:

        async def rounds(store: MetadataStore) -> list[int]:
            out = []
            for _ in range(15):
                got = await store.release_tiles({"tessera": 40}, limit=3, usage_window=300)
                out += [t.generation for t in got.tiles]
            return out

        a, b = await asyncio.gather(rounds(runtime.db), rounds(other))
    finally:
        await other.close()
    assert len(a) + len(b) == 40, "the window (40), not the 90 rounds' worth"
    assert set(a + b) == {1}
    tiles = [t for j in jobs for t in await runtime.db.list_tiles(j)]
    assert sum(t.published_at is not None for t in tiles) == 40
    assert all(t.generation == (1 if t.published_at else 0) for t in tiles)


async def test_a_large_job_cancelled_before_release_publishes_nothing(runtime: Runtime) -> None:
    """4,000 tiles planned, cancelled before any release: no TILES message for them, ever."""
    job_id = await _job(runtime, width=640, height=400)  # 80 x 50 tiles of 8 px
    assert len(await runtime.db.list_tiles(job_id)) == 4000
    await runtime.db.request_cancel(job_id)
    live = await _job(runtime, "other")
    dispatcher = Dispatcher(runtime)
    released = await dispatcher.dispatch_once({"tessera": 5000})
    assert _by_job(released) == {live: TILES}, "only the live job's tiles"
    assert await dispatcher.dispatch_once({"tessera": 5000}) == []
    assert await _messages(runtime) == TILES
    stream = runtime.names.stream(n.STREAM_TILES)
    listed = await runtime.js.stream_info(stream, runtime.names.tile_subjects_of(job_id))
    assert not listed.state.subjects
    assert {t.state for t in await runtime.db.list_tiles(job_id)} == {TileState.CANCELLED}


async def test_the_window_comes_from_the_live_workers(runtime: Runtime) -> None:
    """Two announced workers (2 and 3 threads, factor 2): a window of 10; one removed: 4."""
    job_id = await _job(runtime)
    bucket = LiveWorkers(runtime.js, runtime.names.bucket(n.BUCKET_WORKERS))
    for node, threads in (("w1", 2), ("w2", 3)):
        await bucket.put(WorkerInfo(node, threads, 2 * threads, {"tessera": "k1"}, "t", 0.0))
    dispatcher = Dispatcher(runtime)
    assert await dispatcher.capacity() == {"tessera": 10}
    assert len(await dispatcher.dispatch_once()) == 10
    await bucket.remove("w2")
    assert [w.node for w in await bucket.list()] == ["w1"]
    dispatcher = Dispatcher(runtime)  # a fresh reading of the bucket
    assert await dispatcher.capacity() == {"tessera": 4}
    assert await dispatcher.dispatch_once() == [], "10 released and unfinished, window 4"
    await eventually(lambda: _messages_are(runtime, 10), timeout=5, what="the 10 released messages")
    assert sum(t.published_at is not None for t in await runtime.db.list_tiles(job_id)) == 10


async def _messages_are(rt: Runtime, count: int) -> bool:
    return await _messages(rt) == count


async def _attempts(rt: Runtime, job_id: str, seconds: float, count: int = 5) -> None:
    """``count`` done attempts of ``job_id`` that took ``seconds`` each and just ended."""
    await _sql(
        rt,
        "INSERT INTO attempts (attempt_id, job_id, tile_index, kind, started_at, ended_at, "
        "outcome) SELECT $1 || i, $2, 47, 'tile', now() - make_interval(secs => $3), now(), "
        "'done' FROM generate_series(1, $4) i",
        f"{job_id}-",
        job_id,
        seconds,
        count,
    )


async def _released(rt: Runtime, job_id: str) -> int:
    return sum(t.published_at is not None for t in await rt.db.list_tiles(job_id))


async def _announce(rt: Runtime, *workers: tuple[str, str]) -> None:
    """Workers of 2 threads: ``(node, renderer)``."""
    bucket = LiveWorkers(rt.js, rt.names.bucket(n.BUCKET_WORKERS))
    for node, renderer in workers:
        await bucket.put(WorkerInfo(node, 2, 4, {renderer: "k1"}, "t", 0.0))


async def test_the_window_buffers_short_tiles_and_not_long_ones(runtime: Runtime) -> None:
    """One 2-thread worker per renderer (base window 2 x 2 = 4 each, at most 8 x 2 = 16): the
    tessera job's recent attempts took 1 ms, the blender job's 60 s. Once a tile-done nudge has
    let the running dispatcher measure a round's latency (a round is due after 2 of them: the
    workers' spare tiles), the tessera window grows past its base
    (tiles waiting in TILES for the next free slot); the blender window stays at 4."""
    short, long = await _job(runtime), await _job(runtime, renderer="blender")
    await _attempts(runtime, short, 0.001)
    await _attempts(runtime, long, 60.0)
    await _announce(runtime, ("w1", "tessera"), ("w2", "blender"))
    dispatcher = Dispatcher(runtime)
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        await eventually(lambda: _released(runtime, long), what="the first round's release")
        assert await _released(runtime, short) == 4, "no nudge yet: no round latency, no buffer"
        done = runtime.names.event_subject(short, n.EventKind.TILE_DONE)
        for _ in range(2):  # each worker holds 2 tiles beyond its 2 threads: a round per 2
            await runtime.nc.publish(done, b"")
        await eventually(lambda: _more_than(runtime, short, 4), what="the buffer released")
    finally:
        stop.set()
        await task
    assert dispatcher.gap.value is not None and dispatcher.gap.value > 0
    tessera, blender = dispatcher.windows["tessera"], dispatcher.windows["blender"]
    assert blender == Window(4, 0, 2, measured=True), "60 s tiles: no buffer, 2 spare in hand"
    assert tessera.base == 4 and 0 < tessera.buffer <= 12
    assert await _released(runtime, short) == tessera.capacity
    assert await _released(runtime, long) == 4


async def _more_than(rt: Runtime, job_id: str, count: int) -> bool:
    return await _released(rt, job_id) > count


async def test_tile_done_nudges_are_coalesced_while_a_buffer_is_waiting(
    runtime: Runtime,
) -> None:
    """With a buffer of 12 short tiles, a round is due after 6 tile-done nudges, not each one;
    a plan's nudge is due at once."""
    short = await _job(runtime)
    await _attempts(runtime, short, 0.001)
    await _announce(runtime, ("w1", "tessera"))
    dispatcher = Dispatcher(runtime)
    assert dispatcher.windows == {} and (await dispatcher.capacity()) == {"tessera": 4}
    dispatcher.gap.add(0.01)  # a round answered a nudge in 10 ms
    assert await dispatcher.capacity() == {"tessera": 16}
    assert dispatcher.windows["tessera"] == Window(4, 12, 6, measured=True)
    for _ in range(5):
        dispatcher.tile_done()
    assert not dispatcher.wake.is_set()
    dispatcher.tile_done()
    assert dispatcher.wake.is_set()
    dispatcher.wake.clear()
    dispatcher.nudge()
    assert dispatcher.wake.is_set()


async def test_long_tiles_are_refilled_once_the_workers_spare_tiles_are_done(
    runtime: Runtime,
) -> None:
    """Long tiles get no buffer; the 2-thread worker holds 4 of them, so a round is due after
    2 tile-done nudges (each thread still has a tile after any 2 finished), not after each.
    A worker that holds no more than it renders (in hand 2) brings the round back to each."""
    long = await _job(runtime, renderer="blender")
    await _attempts(runtime, long, 60.0)
    await _announce(runtime, ("w1", "blender"))
    dispatcher = Dispatcher(runtime)
    assert await dispatcher.capacity() == {"blender": 4}
    dispatcher.gap.add(0.01)
    await dispatcher.capacity()
    assert dispatcher.windows["blender"] == Window(4, 0, 2, measured=True)
    dispatcher.tile_done()
    assert not dispatcher.wake.is_set()
    dispatcher.tile_done()
    assert dispatcher.wake.is_set()

    bucket = LiveWorkers(runtime.js, runtime.names.bucket(n.BUCKET_WORKERS))
    await bucket.put(WorkerInfo("w2", 2, 2, {"blender": "k1"}, "t", 0.0))
    tight = Dispatcher(runtime)
    await tight.capacity()
    assert tight.windows["blender"] == Window(8, 0, 1, measured=True)
    tight.tile_done()
    assert tight.wake.is_set()


async def test_room_messages_replace_tile_done_events_once_every_live_worker_sends_them(
    runtime: Runtime,
) -> None:
    """Long tiles, a round due after 2 tiles. While a live worker does not announce ``room``
    (one from before Room messages), the dispatcher counts the tile-done events and ignores
    Room messages (the new worker sends both: each tile would count twice); once every live
    worker announces it, it counts the tiles the Room messages carry and ignores tile-done
    events."""
    long = await _job(runtime, renderer="blender")
    await _attempts(runtime, long, 60.0)
    bucket = LiveWorkers(runtime.js, runtime.names.bucket(n.BUCKET_WORKERS))
    await bucket.put(WorkerInfo("new", 2, 4, {"blender": "k1"}, "t", 0.0, room=True))
    await bucket.put(WorkerInfo("old", 2, 4, {"blender": "k1"}, "t", 0.0))

    async def measured() -> Dispatcher:
        dispatcher = Dispatcher(runtime)
        dispatcher.gap.add(0.01)
        await dispatcher.capacity()
        assert dispatcher.windows["blender"] == Window(8, 0, 2, measured=True)
        return dispatcher

    def msg(data: bytes) -> Msg:
        return Msg(runtime.nc, runtime.names.room_subject, data=data)

    mixed = await measured()
    assert not mixed.rooms
    await mixed._on_room(msg(Room(2).encode()))
    assert not mixed.wake.is_set(), "a Room is not counted beside the tile-done events"
    await mixed._on_done(msg(b""))
    assert not mixed.wake.is_set()
    await mixed._on_done(msg(b""))
    assert mixed.wake.is_set()

    await bucket.put(WorkerInfo("old", 2, 4, {"blender": "k1"}, "t", 0.0, room=True))
    upgraded = await measured()
    assert upgraded.rooms
    for _ in range(3):
        await upgraded._on_done(msg(b""))
    await upgraded._on_room(msg(b"\xc1"))  # undecodable: ignored
    await upgraded._on_room(msg(Room(1).encode()))
    assert not upgraded.wake.is_set(), "tile-done events are not counted, 1 tile of 2"
    await upgraded._on_room(msg(Room(1).encode()))
    assert upgraded.wake.is_set()


async def test_the_dispatcher_stops_hearing_tile_done_events_once_every_worker_sends_room(
    runtime: Runtime,
) -> None:
    """A running dispatcher subscribes to the tile-done events while a live worker sends no
    Room messages, drops the subscription (no wake-up per tile) once every one does, takes it
    back when an old worker joins; a Room message over NATS brings a nudged round (its latency
    measured)."""
    long = await _job(runtime, renderer="blender")
    await _attempts(runtime, long, 60.0)
    bucket = LiveWorkers(runtime.js, runtime.names.bucket(n.BUCKET_WORKERS))
    await bucket.put(WorkerInfo("old", 2, 4, {"blender": "k1"}, "t", 0.0))
    dispatcher = Dispatcher(runtime)
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        await eventually(lambda: dispatcher._tile_dones is not None, what="tile-done heard")
        await eventually(lambda: _released(runtime, long), what="the first round's release")
        await bucket.put(WorkerInfo("old", 2, 4, {"blender": "k1"}, "t", 0.0, room=True))
        await eventually(lambda: dispatcher._tile_dones is None, timeout=15,
                         what="the tile-done subscription dropped")  # fmt: skip
        assert dispatcher.gap.value is None, "no nudge yet"
        await runtime.nc.publish(runtime.names.room_subject, Room(2).encode())
        await eventually(lambda: dispatcher.gap.value is not None, what="a round on the Room")
        await bucket.put(WorkerInfo("older", 2, 4, {"blender": "k1"}, "t", 0.0))
        await eventually(lambda: dispatcher._tile_dones is not None, timeout=15,
                         what="the tile-done subscription back")  # fmt: skip
    finally:
        stop.set()
        await task


class _Recording(Dispatcher):
    """The dispatcher, noting each round's ``(empty rounds before it, tiles it released)``."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.rounds: list[tuple[int, int]] = []

    async def dispatch_once(self, fixed: Mapping[str, int] | None = None) -> list[Tile]:
        empty = self._empty
        tiles = await super().dispatch_once(fixed)
        self.rounds.append((empty, len(tiles)))
        return tiles


@contextlib.asynccontextmanager
async def _running(
    rt: Runtime, *, interval: float, idle: float, empty: int = 0
) -> AsyncIterator[_Recording]:
    """A recording dispatcher running rounds with these timer waits (its backoff at ``empty``),
    stopped (and its last round awaited) on the way out."""
    dispatcher = _Recording(rt)
    dispatcher.config = dataclasses.replace(
        dispatcher.config, dispatch_interval=interval, dispatch_idle_interval=idle
    )
    dispatcher._empty = empty
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    try:
        yield dispatcher
    finally:
        stop.set()
        await task


async def test_rounds_that_release_nothing_back_off_and_a_nudge_ends_the_wait(
    runtime: Runtime,
) -> None:
    """Each round that releases nothing doubles the wait before the next (up to the idle
    interval); a nudge ends even the longest wait, and a nudged round that releases tiles leaves
    the wait as long as it was (events bring the rounds while they come)."""
    assert [idle_wait(0.25, 2.0, k) for k in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert idle_wait(0.25, 0.1, 3) == 0.25, "never below the interval"
    await _announce(runtime, ("w1", "tessera"))
    async with _running(runtime, interval=0.05, idle=120.0) as dispatcher:
        await eventually(lambda: len(dispatcher.rounds) >= 3, what="three empty rounds")
        assert dispatcher.rounds[:3] == [(0, 0), (1, 0), (2, 0)]
        dispatcher._empty = 30  # as after a long idle spell: the next wait is the idle interval
        dispatcher.nudge()
        await eventually(lambda: (30, 0) in dispatcher.rounds, what="the nudged round")
        job_id = await _job(runtime)
        dispatcher.nudge()  # as the planner does after a plan, during a 120 s wait
        # (the round is recorded once it has published, after its release committed)
        await eventually(lambda: len(dispatcher.rounds) >= 5, timeout=30, what="the nudge's round")
        assert dispatcher.rounds[4] == (31, 4), dispatcher.rounds
        assert await _released(runtime, job_id) == 4
        # (set before the dispatcher next awaits, so before this task runs again)
        assert dispatcher._empty == 31, "the window is full: only another event opens room"


def test_the_backoff_counts_empty_rounds_and_resets_on_what_the_timer_finds() -> None:
    assert backoff_after(3, 0, nudged=False) == 4
    assert backoff_after(3, 0, nudged=True) == 4, "a nudge that found nothing"
    assert backoff_after(3, 5, nudged=True) == 3, "the events are bringing the rounds"
    assert backoff_after(3, 5, nudged=False) == 0, "tiles became releasable with no event"


async def test_a_round_the_timer_starts_that_releases_tiles_brings_the_short_wait_back(
    runtime: Runtime,
) -> None:
    """Tiles that became releasable with no event (here: planned by a planner that does not
    nudge this dispatcher) are found by a round the timer started; it resets the backoff, so
    the next wait is the short interval, not the idle one."""
    await _announce(runtime, ("w1", "tessera"))
    job_id = await _job(runtime)
    # (empty=30: as after a long idle spell)
    async with _running(runtime, interval=0.05, idle=120.0, empty=30) as dispatcher:
        # (the first round starts at once, with no nudge: as a timer round)
        await eventually(lambda: len(dispatcher.rounds) >= 2, timeout=30, what="two rounds")
        assert dispatcher.rounds[:2] == [(30, 4), (0, 0)], dispatcher.rounds
        assert await _released(runtime, job_id) == 4


def _rounds_past(dispatcher: _Recording, count: int) -> bool:
    return len(dispatcher.rounds) > count


async def test_job_control_events_nudge_the_dispatcher(runtime: Runtime) -> None:
    """A resume, pause, cancel, failure, dead letter or retry of any job ends the wait at once
    (the timer here would wait 120 s)."""
    async with _running(runtime, interval=120.0, idle=120.0) as dispatcher:
        # the subscriptions are made before the first round, on the connection published on
        await eventually(lambda: dispatcher.rounds, what="the first round")
        kinds = ["job-resumed", "job-paused", "job-cancelled", "job-failed",
                 "job-dead-lettered", "job-retried"]  # fmt: skip
        for kind in map(n.EventKind, kinds):
            past = functools.partial(_rounds_past, dispatcher, len(dispatcher.rounds))
            await runtime.nc.publish(runtime.names.event_subject("j1", kind), b"{}")
            await eventually(past, what=f"a round on {kind}")


async def test_tiny_tiles_share_messages_in_runs(runtime: Runtime) -> None:
    """48 tiles of 8x8 at 1 spp (64 pixel-samples each, a run of at most 16 by default) go out
    as 3 messages of 16 consecutive tiles; every tile is in exactly one, under its generation;
    tiles of 32,768 spp (2,097,152 pixel-samples each, more than half a run's default work) go
    alone, and so do a Blender job's."""
    runtime = _runs(runtime)
    tiny = await _job(runtime)
    big = await _job(runtime, "other", spp=32768)
    blender = await _job(runtime, "third", renderer="blender")  # a process per tile: alone
    released = await Dispatcher(runtime).dispatch_once({"tessera": 96, "blender": 48})
    assert _by_job(released) == {tiny: TILES, big: TILES, blender: TILES}
    messages = await _tile_messages(runtime)
    runs = sorted((m.tile_index, m.run) for m in messages if m.job_id == tiny)
    assert runs == [(0, 16), (16, 16), (32, 16)]
    for alone in (big, blender):
        assert sorted(m.tile_index for m in messages if m.job_id == alone) == list(range(TILES))
        assert {m.run for m in messages if m.job_id == alone} == {1}
    assert {m.generation for m in messages} == {1}


async def test_runs_can_be_turned_off(runtime: Runtime) -> None:
    """``TESSERA_DISPATCH_RUN=1``: one message per tile, tiny or not."""
    rt = _with(runtime, dispatch_run=1)
    await _job(rt)
    assert len(await Dispatcher(rt).dispatch_once({"tessera": 48})) == TILES
    assert [m.run for m in await _tile_messages(rt)] == [1] * TILES


async def test_the_window_counts_messages_and_a_run_counts_once(runtime: Runtime) -> None:
    """The window counts messages: a job's unfinished tiles are ceil(n / run) of them (a worker
    holds a message until its last tile is done). A window of 2 takes 32 of a tiny job's tiles
    (two runs of 16). With 13 of them done, both messages are still held: nothing more. With the
    first run done, one is: the next round releases the job's last 16 tiles as one message.
    A job whose tiles go alone then waits while those two messages are out, and takes two
    tiles, a message each, once they are done."""
    runtime = _runs(runtime)
    tiny = await _job(runtime)
    dispatcher = Dispatcher(runtime)
    first = await dispatcher.dispatch_once({"tessera": 2})
    assert [t.tile_index for t in first] == list(range(32))
    assert sorted(m.run for m in await _tile_messages(runtime)) == [16, 16]
    await _sql(runtime, "UPDATE tiles SET state = 'done' WHERE job_id = $1 AND tile_index < 13",
               tiny)  # fmt: skip
    assert await dispatcher.dispatch_once({"tessera": 2}) == [], "both messages still held"
    await _sql(runtime, "UPDATE tiles SET state = 'done' WHERE job_id = $1 AND tile_index < 16",
               tiny)  # fmt: skip
    second = await dispatcher.dispatch_once({"tessera": 2})
    assert [t.tile_index for t in second] == list(range(32, 48))
    assert sorted(m.run for m in await _tile_messages(runtime)) == [16, 16, 16]
    alone = await _job(runtime, "other", spp=32768)
    assert await dispatcher.dispatch_once({"tessera": 2}) == [], "two messages are out"
    await _sql(runtime, "UPDATE tiles SET state = 'done' WHERE job_id = $1", tiny)
    third = await dispatcher.dispatch_once({"tessera": 2})
    assert _by_job(third) == {alone: 2}
