"""The sweeper against real servers: it re-publishes lost tiles and only those.

The sweeper runs in-process on a scheduler Runtime, the planner writes the rows and a dispatcher
round releases them (real TILES messages, generation 1),
and a miniature worker (lease, fence, fenced commit, release, ack: the worker's own store and
lease calls) renders tiles at a pause point (:mod:`shared.core.pauses`) inside the sweep, which is
where the issue-14 race happened: tiles read as stale, then rendered, committed and acked
before the sweeper got to them.
"""

from __future__ import annotations

import dataclasses
import hashlib

import asyncpg
import pytest
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from proto.messages import JobMessage, TileMessage, TilesDone
from services.scheduler.dispatch import Dispatcher
from services.scheduler.planner import Planner
from services.scheduler.sweeper import Sweeper
from shared.core import pauses
from shared.core.lifecycle import TileState
from shared.metadata import CommitOutcome, Tile, TileCommit
from shared.nats.jetstream import ack_sync_retry
from shared.nats.leases import LeaseOwner
from shared.service.runtime import Runtime
from tests.metadata.conftest import make_new_job

TILES = 48
"""A 64x48 job with 8-pixel tiles."""
G = 1
"""The generation of a tile's first release."""


async def _job(rt: Runtime, *, publish: bool = True, run: int = 1) -> str:
    """A submitted job with its 48 tiles planned (and, with ``publish``, released: their
    messages published by a dispatcher round, one per tile, or per ``run`` tiles)."""
    job_id = (await rt.db.submit_job(make_new_job(tile_size=8, spp=1))).job.job_id
    await Planner(rt).plan(JobMessage(job_id, 0))
    if publish:
        scheduler = dataclasses.replace(rt.settings.scheduler, dispatch_run=run)
        dispatching = dataclasses.replace(
            rt, settings=dataclasses.replace(rt.settings, scheduler=scheduler)
        )
        released = await Dispatcher(dispatching).dispatch_once({"tessera": 1000})
        assert len(released) == TILES
    return job_id


async def _age(rt: Runtime, job_id: str) -> None:
    """Move the tiles' publish and update times two minutes back (instead of sleeping)."""
    conn = await asyncpg.connect(rt.settings.database_url)
    try:
        await conn.execute(
            "UPDATE tiles SET published_at = published_at - interval '2 minutes', "
            "updated_at = updated_at - interval '2 minutes' WHERE job_id = $1",
            job_id,
        )
    finally:
        await conn.close()


async def _take_messages(rt: Runtime, count: int) -> dict[int, Msg]:
    """Fetch ``count`` TILES messages from the workers' consumer, by tile index."""
    sub = await rt.js.pull_subscribe_bind(
        durable=n.CONSUMER_WORKERS, stream=rt.names.stream(n.STREAM_TILES)
    )
    got: dict[int, Msg] = {}
    for _ in range(20):  # bounded: a fetch returns what is there, not always a full batch
        if len(got) >= count:
            break
        for msg in await sub.fetch(batch=count - len(got), timeout=5):
            got[TileMessage.decode(msg.data).tile_index] = msg
    assert len(got) == count, f"fetched {len(got)} of {count} tile messages"
    return got


async def _render(rt: Runtime, job_id: str, index: int, msg: Msg | None = None) -> None:
    """What a worker does with a tile: lease, fence, commit (inline result), release, ack."""
    owner = LeaseOwner("test-worker", f"attempt-{job_id}-{index}")
    lease = await rt.leases.acquire(n.lease_key_tile(job_id, index), owner)
    assert lease is not None
    assert await rt.db.fence_tile(
        job_id, index, token=lease.token, attempt_id=owner.attempt_id, node=owner.node
    )
    data = f"result {index}".encode()
    done = TileCommit(
        job_id,
        index,
        token=lease.token,
        attempt_id=owner.attempt_id,
        result_key=None,
        result_sha256=hashlib.sha256(data).hexdigest(),
        samples_done=1,
        node=owner.node,
        result_data=data,
    )
    assert await rt.db.commit_tile(done) is CommitOutcome.COMMITTED
    assert await rt.leases.release(lease)
    if msg is not None:
        await ack_sync_retry(msg)


async def _delete_messages(rt: Runtime, job_id: str, indexes: list[int]) -> None:
    """Lose the tiles' messages (as a stale owner's late ack would)."""
    stream = rt.names.stream(n.STREAM_TILES)
    for i in indexes:
        msg = await rt.js.get_last_msg(stream, rt.names.tile_subject(job_id, i))
        assert msg.seq is not None
        await rt.js.delete_msg(stream, msg.seq)


async def _generation_in_stream(rt: Runtime, job_id: str, index: int) -> int | None:
    """The generation of the tile's message in TILES, or ``None`` if it has none."""
    stream = rt.names.stream(n.STREAM_TILES)
    try:
        msg = await rt.js.get_last_msg(stream, rt.names.tile_subject(job_id, index))
    except StreamMsgNotFound:
        return None
    return TileMessage.decode(msg.data or b"").generation


def _republished(rt: Runtime) -> float:
    return rt.metrics.registry.get_sample_value("tessera_sweeper_republished_total") or 0.0


def _skipped(rt: Runtime, reason: str) -> float:
    sample = "tessera_sweeper_skipped_total"
    return rt.metrics.registry.get_sample_value(sample, {"reason": reason}) or 0.0


async def _tiles(rt: Runtime, job_id: str) -> list[Tile]:
    return await rt.db.list_tiles(job_id)


async def test_unreleased_tiles_are_never_swept(runtime: Runtime) -> None:
    """Rows written, not released (``published_at`` NULL): waiting for the dispatcher by
    design, however old their rows are."""
    job_id = await _job(runtime, publish=False)
    await _age(runtime, job_id)
    sweeper = Sweeper(runtime)
    assert await sweeper.sweep_once() == []
    assert _republished(runtime) == 0
    assert all(t.generation == 0 and t.published_at is None for t in await _tiles(runtime, job_id))
    assert (await runtime.js.stream_info(sweeper.stream)).state.messages == 0


async def test_released_tiles_never_published_are_swept(runtime: Runtime) -> None:
    """A dispatcher killed between its release and the publishes (``scheduler.after_release``):
    the rows are stamped, no message exists; after the sweep age they are re-published."""
    job_id = await _job(runtime, publish=False)
    released = await runtime.db.release_tiles({"tessera": 1000}, limit=1000, usage_window=300)
    assert len(released.tiles) == TILES
    sweeper = Sweeper(runtime)
    assert await sweeper.sweep_once() == [], "released just now: not stale yet"
    await _age(runtime, job_id)
    swept = await sweeper.sweep_once()
    assert sorted(t.tile_index for t in swept) == list(range(TILES))
    assert _republished(runtime) == TILES
    assert {await _generation_in_stream(runtime, job_id, i) for i in range(TILES)} == {G + 1}


@pytest.mark.parametrize("point", ["sweeper.after_snapshot", "sweeper.before_claim"])
async def test_tiles_done_during_the_sweep_are_not_republished(
    runtime: Runtime, point: str
) -> None:
    """The issue-14 race: the snapshot says stale, the tile is done by the re-publish."""
    job_id = await _job(runtime)
    await _age(runtime, job_id)
    if point == "sweeper.after_snapshot":
        # Rendered, committed and acked after the snapshot, before the broker checks: the
        # checks find no lease and no message, as in the 4,096-tile run.
        msgs = await _take_messages(runtime, TILES)
    else:
        # No message and no lease when the broker checks run (the messages were lost), and
        # a worker finishes the tiles after the checks, right before the re-publish.
        await _delete_messages(runtime, job_id, list(range(TILES)))
        msgs = {}

    async def workers_finish() -> None:
        for i in range(TILES):
            await _render(runtime, job_id, i, msgs.get(i))

    sweeper = Sweeper(runtime)
    with pauses.installed(point, workers_finish):
        swept = await sweeper.sweep_once()
    assert [(t.job_id, t.tile_index) for t in swept] == []
    assert _republished(runtime) == 0
    tiles = await _tiles(runtime, job_id)
    assert all(t.state is TileState.DONE and t.generation == G for t in tiles)
    assert (await runtime.js.stream_info(sweeper.stream)).state.messages == 0
    assert _skipped(runtime, "changed") == TILES


async def test_only_lost_tiles_are_republished(runtime: Runtime) -> None:
    """Stale tiles with a message or a live lease stay; the rest go out as the next
    generation."""
    job_id = await _job(runtime)
    await _delete_messages(runtime, job_id, [3, 5, 7, 9])
    # tile 5 is being rendered (live lease, no message: a stale owner acked it); tile 7 was
    # handed back, its lease released (a delete marker is left in the bucket for a TTL).
    owner = LeaseOwner("test-worker", "attempt-5")
    assert await runtime.leases.acquire(n.lease_key_tile(job_id, 5), owner) is not None
    released = await runtime.leases.acquire(
        n.lease_key_tile(job_id, 7), LeaseOwner("test-worker", "attempt-7")
    )
    assert released is not None and await runtime.leases.release(released)
    await _age(runtime, job_id)
    sweeper = Sweeper(runtime)
    swept = await sweeper.sweep_once()
    assert sorted(t.tile_index for t in swept) == [3, 7, 9]
    assert all(t.generation == G + 1 for t in swept)
    assert _republished(runtime) == 3
    assert _skipped(runtime, "message") == TILES - 4
    assert _skipped(runtime, "lease") == 1
    by_index = {t.tile_index: t for t in await _tiles(runtime, job_id)}
    for i in (3, 7, 9):
        assert by_index[i].generation == G + 1
        assert await _generation_in_stream(runtime, job_id, i) == G + 1
    assert by_index[5].generation == G and await _generation_in_stream(runtime, job_id, 5) is None
    # The re-published tiles were published just now: the next pass leaves them alone.
    assert await sweeper.sweep_once() == []
    assert _republished(runtime) == 3


async def test_a_sweep_pass_that_outlives_its_snapshot_starts_over(runtime: Runtime) -> None:
    """Broker checks older than the bound are not acted on; a later pass re-publishes."""
    job_id = await _job(runtime)
    await _delete_messages(runtime, job_id, [0, 1])
    await _age(runtime, job_id)
    sweeper = Sweeper(runtime)
    sweeper.max_snapshot_age = 0.0  # every pass is "too old" by the time it could claim
    assert await sweeper.sweep_once() == []
    assert _republished(runtime) == 0
    assert _skipped(runtime, "expired") > 0
    assert all(t.generation == G for t in await _tiles(runtime, job_id))
    sweeper.max_snapshot_age = 60.0
    assert sorted(t.tile_index for t in await sweeper.sweep_once()) == [0, 1]
    assert _republished(runtime) == 2


async def test_a_lost_tile_behind_a_larger_backlog_is_found(runtime: Runtime) -> None:
    """More stale tiles than one snapshot holds, all queued but the last: the sweeper pages
    through them instead of looking at the oldest page again and again."""
    job_id = await _job(runtime)
    await _delete_messages(runtime, job_id, [TILES - 1])
    await _age(runtime, job_id)
    sweeper = Sweeper(runtime)
    sweeper.snapshot_limit = 10
    pages = -(-TILES // sweeper.snapshot_limit)
    swept = [[t.tile_index for t in await sweeper.sweep_once()] for _ in range(pages)]
    assert swept == [[]] * (pages - 1) + [[TILES - 1]]
    assert _republished(runtime) == 1
    assert _skipped(runtime, "message") == TILES - 1
    # The last page was short: the next pass starts from the oldest again.
    assert await sweeper.sweep_once() == []
    assert _skipped(runtime, "message") == TILES - 1 + sweeper.snapshot_limit


async def _tiles_done_in_events(rt: Runtime, job_id: str) -> list[TilesDone]:
    """The job's tiles-done events in EVENTS (the stream keeps consumed ones too)."""
    stream = rt.names.stream(n.STREAM_EVENTS)
    subject = rt.names.event_subject(job_id, n.EventKind.TILES_DONE)
    info = await rt.js.stream_info(stream, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    if count == 0:
        return []
    sub = await rt.js.subscribe(
        subject, ordered_consumer=True, deliver_policy=api.DeliverPolicy.ALL
    )
    try:
        return [TilesDone.decode((await sub.next_msg(timeout=5)).data) for _ in range(count)]
    finally:
        await sub.unsubscribe()


async def test_a_lost_completion_is_announced_once_while_the_finalizer_has_it_pending(
    runtime: Runtime,
) -> None:
    """Every tile committed, no tiles-done event (lost): the sweep announces the completion,
    and while that event waits in the finalizer consumer no second copy is published."""
    job_id = await _job(runtime)
    for i, msg in (await _take_messages(runtime, TILES)).items():
        await _render(runtime, job_id, i, msg)
    sweeper = Sweeper(runtime)
    assert await sweeper._announce_lost_completions(runtime.settings.sweeper.age) == [], (
        "done only just now: the worker's own event may still be on its way"
    )
    await _age(runtime, job_id)
    assert job_id in await sweeper._announce_lost_completions(runtime.settings.sweeper.age)
    completion = max(t.lease_fence for t in await _tiles(runtime, job_id))
    assert await _tiles_done_in_events(runtime, job_id) == [TilesDone(job_id, completion)]
    # the finalizer has not taken it yet: no second copy, however long it waits
    assert await sweeper._announce_lost_completions(runtime.settings.sweeper.age) == []
    await sweeper.sweep_once()
    assert await _tiles_done_in_events(runtime, job_id) == [TilesDone(job_id, completion)]


async def test_a_tile_whose_run_message_is_queued_is_not_republished(runtime: Runtime) -> None:
    """Released in runs of 16 (one message per 16 tiles, subject ``<first>-<last>``): every
    stale tile whose run's message is in the stream stays; the tiles of a run whose message was
    lost are re-published, each alone, under the next generation."""
    job_id = await _job(runtime, run=16)
    stream = runtime.names.stream(n.STREAM_TILES)
    assert (await runtime.js.stream_info(stream)).state.messages == 3
    lost = await runtime.js.get_last_msg(stream, runtime.names.tile_subject(job_id, 16, run=16))
    assert lost.seq is not None
    await runtime.js.delete_msg(stream, lost.seq)
    await _age(runtime, job_id)
    swept = await Sweeper(runtime).sweep_once()
    assert sorted(t.tile_index for t in swept) == list(range(16, 32))
    assert _republished(runtime) == 16
    assert _skipped(runtime, "message") == TILES - 16
    assert {await _generation_in_stream(runtime, job_id, i) for i in range(16, 32)} == {G + 1}
