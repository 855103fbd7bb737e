"""The scheduler's planner, dispatcher and exhausted-deliveries handler on the metadata double.

The metadata store is :class:`~tests.doubles.metadata.MemoryMetadata` (held to PostgreSQL by
``tests/doubles/test_metadata_contract.py``) and the delivery a
:class:`~tests.doubles.delivery.FakeDelivery`; the publishes (TILES, DLQ, EVENTS) go to the
test's real NATS, so what is published, and its de-duplication, is the server's, not a double's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError as StreamMsgNotFound

from proto import names as n
from proto.messages import JobMessage, TileMessage
from services.scheduler.dispatch import Dispatcher
from services.scheduler.exhausted import Exhausted
from services.scheduler.planner import Planner
from shared.core.config import Settings
from shared.core.lifecycle import JobState, TileState, TileTrigger
from shared.metadata import Job
from shared.nats.ensure import ensure_topology
from shared.nats.jetstream import publish
from shared.nats.leases import Leases, ProgressPointers
from shared.objectstore import DirectoryStore
from shared.service.logs import Log
from shared.service.runtime import Runtime, topology_for
from shared.service.settle import ACK, DeadLetter
from tests.doubles.delivery import FakeDelivery
from tests.doubles.metadata import MemoryMetadata
from tests.metadata.conftest import RECTS, make_new_job


@dataclasses.dataclass
class Rig:
    rt: Runtime
    db: MemoryMetadata

    async def messages(self, stream: str) -> int:
        info = await self.rt.js.stream_info(self.rt.names.stream(stream))
        return int(info.state.messages)

    async def job(self, job_id: str) -> Job:
        job = await self.db.get_job(job_id)
        assert job is not None
        return job


@pytest.fixture
async def rig(settings_env: dict[str, str], nc: NATS, tmp_path: Path) -> AsyncIterator[Rig]:
    """A scheduler Runtime on the real NATS of this test, its metadata store the double."""
    settings = Settings.from_env(settings_env)
    topology = topology_for(settings)
    js = nc.jetstream(timeout=10)
    await ensure_topology(js, topology)
    db, names = MemoryMetadata(), topology.names
    rt = Runtime(
        settings=settings,
        service="scheduler",
        log=Log("test.scheduler"),
        nc=nc,
        js=js,
        topology=topology,
        # Runtime names the real store; the handlers use only the operations the double has
        # (and the contract suite holds it to them), so the type is the one thing waived here.
        db=db,  # type: ignore[arg-type]
        store=await DirectoryStore.open(tmp_path / "objects"),
        leases=Leases(js, names.bucket(n.BUCKET_LEASES), settings.leases.ttl),
        progress=ProgressPointers(js, names.bucket(n.BUCKET_PROGRESS)),
        retry=settings.delivery.retry_policy(),
    )
    yield Rig(rt, db)


async def _submitted(rig: Rig) -> Job:
    return (await rig.db.submit_job(make_new_job())).job


def _job_delivery(job: Job) -> FakeDelivery:
    return FakeDelivery(JobMessage(job.job_id, job.generation).encode())


async def test_plan_writes_the_tiles_and_publishes_nothing(rig: Rig):
    job = await _submitted(rig)
    nudged: list[bool] = []
    planner = Planner(rig.rt, on_planned=lambda: nudged.append(True))
    assert await planner.outcome(_job_delivery(job)) is ACK
    tiles = await rig.db.list_tiles(job.job_id)
    assert [t.rect for t in tiles] == [tuple(r) for r in RECTS]
    assert all(t.state is TileState.QUEUED and t.published_at is None for t in tiles)
    assert (await rig.job(job.job_id)).state is JobState.RUNNING
    assert await rig.messages(n.STREAM_TILES) == 0, "the dispatcher releases them"
    assert nudged == [True]


async def test_a_replan_is_idempotent(rig: Rig):
    job = await _submitted(rig)
    planner = Planner(rig.rt)
    assert await planner.outcome(_job_delivery(job)) is ACK
    before = await rig.db.list_tiles(job.job_id)
    assert await planner.outcome(FakeDelivery(_job_delivery(job).data, deliveries=2)) is ACK
    after = await rig.db.list_tiles(job.job_id)
    assert after == before
    assert await rig.messages(n.STREAM_TILES) == 0
    assert (await rig.job(job.job_id)).state is JobState.RUNNING


async def test_a_dispatch_round_publishes_what_it_released(rig: Rig):
    # 32x32 tiles at 2,048 spp: 2,097,152 pixel-samples each, so each goes alone (no run)
    job = (await rig.db.submit_job(make_new_job(spp=2048))).job
    assert await Planner(rig.rt).outcome(_job_delivery(job)) is ACK
    dispatcher = Dispatcher(rig.rt)
    first = await dispatcher.dispatch_once({"tessera": 3})
    assert [(t.tile_index, t.generation) for t in first] == [(0, 1), (1, 1), (2, 1)]
    assert await rig.messages(n.STREAM_TILES) == 3
    stream = rig.rt.names.stream(n.STREAM_TILES)
    msg = await rig.rt.js.get_last_msg(stream, rig.rt.names.tile_subject(job.job_id, 0))
    assert msg.headers is not None
    assert msg.headers["Nats-Msg-Id"] == n.tile_msg_id(job.job_id, 0, 1)
    assert TileMessage.decode(msg.data or b"").generation == 1
    assert await dispatcher.dispatch_once({"tessera": 3}) == [], "the window is full"
    assert [t.tile_index for t in await dispatcher.dispatch_once({"tessera": 4})] == [3]
    registry = rig.rt.metrics.registry
    released = registry.get_sample_value("tessera_dispatch_released_total", {"renderer": "tessera"})
    assert released == 4


async def test_a_cancelled_job_is_not_planned(rig: Rig):
    job = await _submitted(rig)
    await rig.db.request_cancel(job.job_id)
    assert await Planner(rig.rt).outcome(_job_delivery(job)) is ACK
    assert await rig.db.list_tiles(job.job_id) == []
    assert await rig.messages(n.STREAM_TILES) == 0


async def test_an_undecodable_job_message_is_dead_lettered(rig: Rig):
    d = FakeDelivery(b"not json")
    outcome = await Planner(rig.rt).outcome(d)
    assert isinstance(outcome, DeadLetter)
    assert (outcome.job_id, outcome.unit, outcome.error.code) == (
        None,
        n.DLQ_UNIT_JOB,
        "bad_request",
    )


async def _exhausted_tile(rig: Rig) -> tuple[Job, int]:
    """A planned job whose tile 0 failed once (its last error) and whose message is in TILES."""
    job = await _submitted(rig)
    await rig.db.plan_tiles(job.job_id, RECTS)
    assert await rig.db.fence_tile(job.job_id, 0, token=3, attempt_id="a", node="w")
    await rig.db.fail_tile(job.job_id, 0, token=3, attempt_id="a",
                           trigger=TileTrigger.RETRYABLE_FAILURE, error_code="stalled",
                           error="no progress", node="w", outcome="retryable")  # fmt: skip
    names = rig.rt.names
    ack = await publish(rig.rt.js, names.tile_subject(job.job_id, 0), TileMessage(job.job_id, 0),
                        msg_id=n.tile_msg_id(job.job_id, 0, 0))  # fmt: skip
    return job, ack.seq


def _advisory(rig: Rig, seq: int) -> FakeDelivery:
    stream = rig.rt.names.stream(n.STREAM_TILES)
    return FakeDelivery(orjson.dumps({"stream": stream, "stream_seq": seq, "deliveries": 5}))


async def test_exhausted_deliveries_dead_letter_the_tile_and_its_job(rig: Rig):
    job, seq = await _exhausted_tile(rig)
    handler = Exhausted(rig.rt)
    assert await handler.outcome(_advisory(rig, seq)) is ACK
    tile = await rig.db.get_tile(job.job_id, 0)
    assert tile is not None and tile.state is TileState.DEAD_LETTERED
    assert tile.last_error is not None and "[stalled]: no progress" in tile.last_error
    failed = await rig.job(job.job_id)
    assert (failed.state, failed.last_error_code) == (JobState.DEAD_LETTERED, "max_deliveries")
    assert await rig.messages(n.STREAM_DLQ) == 1
    with pytest.raises(StreamMsgNotFound):
        await rig.rt.js.get_msg(rig.rt.names.stream(n.STREAM_TILES), seq)

    # The advisory again (a crash before its ack): nothing repeats.
    assert await handler.outcome(_advisory(rig, seq)) is ACK
    assert await rig.messages(n.STREAM_DLQ) == 1
    assert (await rig.job(job.job_id)).state is JobState.DEAD_LETTERED


async def test_an_unreadable_advisory_is_dropped(rig: Rig):
    assert await Exhausted(rig.rt).outcome(FakeDelivery(b"{")) is ACK
    assert await rig.messages(n.STREAM_DLQ) == 0
