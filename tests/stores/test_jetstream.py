"""Bounded JetStream publishes and acks against real servers, including a NATS restart."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from proto import names as n
from proto.messages import TileDone, TileMessage, TilesDone
from proto.topology import Topology
from shared.core.errors import LeaseLost, StoreUnavailable
from shared.devstack.procs import free_port
from shared.devstack.stack import NatsServer, Stack
from shared.nats.ensure import ensure_topology
from shared.nats.jetstream import ack_sync_retry, connect_nats, publish, publish_unconfirmed
from shared.nats.leases import Lease, LeaseOwner, Leases
from tests.helpers import eventually
from tests.stores.support import nats_settings


async def test_same_msg_id_twice_is_a_duplicate(js: JetStreamContext, topology: Topology):
    subject = topology.names.event_subject("job1", n.EventKind.TILE_DONE)
    first = await publish(js, subject, b"one", msg_id=n.done_msg_id("job1", 0, 1))
    again = await publish(js, subject, b"two", msg_id=n.done_msg_id("job1", 0, 1))
    assert not first.duplicate
    assert again.duplicate is True and again.seq == first.seq
    msg = await js.get_msg(topology.names.stream(n.STREAM_EVENTS), seq=first.seq)
    assert msg.data == b"one"  # the first payload wins


async def test_publish_without_a_stream_gives_up_within_the_bound(js: JetStreamContext):
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="no answer"):
        await publish(js, f"nowhere.{uuid.uuid4().hex}", b"x", msg_id="m", timeout_total=1.0)
    assert 0.5 < time.monotonic() - started < 3.0


async def test_msg_ttl_must_be_whole_seconds(js: JetStreamContext):
    for bad in (0, 1.5, -1):
        with pytest.raises(ValueError, match="whole seconds"):
            await publish(js, "x", b"", msg_id=None, msg_ttl=bad)  # type: ignore[arg-type]


async def test_ack_sync_retry_acks_on_a_real_consumer(
    stack: Stack, js: JetStreamContext, topology: Topology
):
    stream = topology.names.stream(n.STREAM_TILES)
    await publish(js, topology.names.tile_subject("job1", 0), b"t", msg_id="tile:job1:0:0")
    sub = await js.pull_subscribe_bind(n.CONSUMER_WORKERS, stream)
    [msg] = await sub.fetch(1, timeout=5)
    await ack_sync_retry(msg)
    info = await js.consumer_info(stream, n.CONSUMER_WORKERS)
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await sub.unsubscribe()

    # On a closed connection the ack fails at once, loudly.
    other = await nats.connect(stack.nats.url)
    await publish(js, topology.names.tile_subject("job1", 1), b"t", msg_id="tile:job1:1:0")
    sub2 = await other.jetstream().pull_subscribe_bind(n.CONSUMER_WORKERS, stream)
    [late] = await sub2.fetch(1, timeout=5)
    await other.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await ack_sync_retry(late, timeout_total=2)


async def test_connect_nats_to_nothing_is_bounded(tmp_path: Path):
    settings = nats_settings(f"nats://127.0.0.1:{free_port()}", tmp_path)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="did not accept"):
        await connect_nats(settings, name="test", connect_within=1.0)
    assert time.monotonic() - started < 3.0


@pytest.mark.chaos
async def test_nats_restart_loses_the_lease_then_recovers(tmp_path: Path):
    server = NatsServer(tmp_path / "nats")
    server.start()
    client: NATS | None = None
    try:
        client = await connect_nats(nats_settings(server.url, tmp_path), name="restart-test")
        js = client.jetstream()
        topology = Topology(prefix="restart")
        await ensure_topology(js, topology)
        leases = Leases(js, topology.names.bucket(n.BUCKET_LEASES), ttl=2)
        lease = await leases.acquire("tile.job1.0", LeaseOwner("node", "attempt-1"))
        assert lease is not None

        server.stop()
        started = time.monotonic()
        with pytest.raises((LeaseLost, StoreUnavailable)):
            await leases.renew(lease)
        assert time.monotonic() - started < lease.ttl + 1.5

        server.start()  # same port, same store directory
        connected = client

        async def reconnected() -> bool:
            return connected.is_connected

        await eventually(reconnected, timeout=10, what="client reconnect")
        subject = topology.names.event_subject("job1", n.EventKind.TILE_DONE)
        ack = await publish(js, subject, b"after", msg_id="done:job1:0", timeout_total=10)
        assert ack.seq >= 1 and not ack.duplicate
        # A renew sent while disconnected may be flushed on reconnect and land: the old lease
        # is then still ours (same token). Either way, after a release a new owner gets in.
        with contextlib.suppress(LeaseLost):
            lease = await leases.renew(lease)
        await leases.release(lease)
        rival = LeaseOwner("node-2", "attempt-2")

        async def taken() -> Lease | None:
            return await leases.acquire("tile.job1.0", rival)

        fresh = await eventually(taken, timeout=5, what="new owner after restart")
        assert fresh is not None and fresh.token > lease.token
    finally:
        if client is not None:
            await client.close()
        server.stop()
        await asyncio.sleep(0)


async def test_a_message_is_published_with_its_headers_and_msg_id(
    js: JetStreamContext, topology: Topology
):
    tile = TileMessage("job1", 3, 2)
    msg_id = n.tile_msg_id("job1", 3, 2)
    extra = {"X-Trace": "t1", n.HDR_KIND: "overridden"}
    ack = await publish(
        js, topology.names.tile_subject("job1", 3), tile, msg_id=msg_id, headers=extra
    )
    stored = await js.get_msg(topology.names.stream(n.STREAM_TILES), seq=ack.seq)
    assert TileMessage.decode(stored.data or b"") == tile
    assert stored.headers == {
        "Nats-Msg-Id": msg_id,
        "X-Trace": "t1",
        "Tessera-Kind": "tile",
        "Tessera-Job": "job1",
        "Tessera-Tile": "3",
        "Tessera-Generation": "2",
    }
    again = await publish(js, topology.names.tile_subject("job1", 3), tile, msg_id=msg_id)
    assert again.duplicate  # the headers do not change what de-duplication sees


async def test_an_unconfirmed_publish_is_stored_once_under_its_msg_id(
    nc: NATS, js: JetStreamContext, topology: Topology
):
    done = TileDone("job1", 3, "att1", "", "hash1")
    names = topology.names
    subject = names.event_subject("job1", n.EventKind.TILE_DONE)
    msg_id = n.done_msg_id("job1", 3, 7)
    for _ in range(2):
        await publish_unconfirmed(nc, subject, done, msg_id=msg_id)
    # a confirmed publish after them on the same connection: the stream has taken both before
    marker = await publish(js, names.event_subject("job1", n.EventKind.TILES_DONE),
                           TilesDone("job1", 7), msg_id="marker")  # fmt: skip
    stream = names.stream(n.STREAM_EVENTS)
    info = await js.stream_info(stream, subjects_filter=subject)
    assert info.state.subjects == {subject: 1}, "the repeat was absorbed by its Nats-Msg-Id"
    stored = await js.get_last_msg(stream, subject)
    assert stored.seq is not None and stored.seq < marker.seq
    assert TileDone.decode(stored.data or b"") == done
    assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == msg_id
    assert stored.headers["Tessera-Kind"] == n.EventKind.TILE_DONE.value
    await nc.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await publish_unconfirmed(nc, subject, done, msg_id=msg_id)
