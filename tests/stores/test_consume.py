"""The shared consume loop on a real JetStream consumer: what it asks the server for."""

from __future__ import annotations

import asyncio

import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from proto import names as n
from proto.topology import Topology
from shared.nats.jetstream import publish
from shared.service.consume import consume
from shared.service.logs import Log
from tests.helpers import eventually


async def test_an_idle_consumer_waits_for_one_message_and_a_busy_one_fills_its_slots(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Idle, each pull asks for one message, as one request per wait (nats-py sends a batch
    of more as a no-wait probe and then the wait: two requests and two answers per wait of
    an idle service). Once messages come, a pull asks for every free slot; every message is
    handled once."""
    stream = topology.names.stream(n.STREAM_JOBS)
    pulls: list[dict[str, object]] = []

    async def pulled(msg: Msg) -> None:
        pulls.append(orjson.loads(msg.data))

    watch = await nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{n.CONSUMER_SCHEDULER_JOBS}",
                               cb=pulled)  # fmt: skip
    await nc.flush()
    handled: list[bytes] = []
    release = asyncio.Event()

    async def handler(msg: Msg) -> None:
        handled.append(msg.data)
        await release.wait()  # held: the slots stay taken until released
        await msg.ack()

    stop = asyncio.Event()
    task = asyncio.create_task(consume(
        js, stream=stream, durable=n.CONSUMER_SCHEDULER_JOBS, handler=handler, in_hand=4,
        stop=stop, log=Log("test.consume"), fetch_wait=0.2, grace=5.0,
    ))  # fmt: skip
    try:
        # (the first fetch, before any came back empty, asks for every slot)
        await eventually(lambda: len(pulls) >= 6, what="idle pulls")
        idle_pulls = pulls[-3:]
        assert [p.get("batch") for p in idle_pulls] == [1, 1, 1], pulls
        assert not any(p.get("no_wait") for p in idle_pulls), pulls
        idle = len(pulls)
        for i in range(3):
            await publish(js, topology.names.job_subject(f"job{i}"), b"%d" % i, msg_id=f"c{i}")
        await eventually(lambda: len(handled) == 3, what="the three messages handled")
        busy = [p.get("batch") for p in pulls[idle:]]
        assert any(b is not None and int(str(b)) > 1 for b in busy), busy
        release.set()
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await watch.unsubscribe()
    assert sorted(handled) == [b"0", b"1", b"2"]
