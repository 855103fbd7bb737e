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


async def test_a_stop_ends_a_waiting_pull_at_once(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """An idle consumer's pull waits long at the server (``FETCH_WAIT``); a stop does not wait
    it out: the loop ends within a few seconds of a 60 s pull (before, it ended when the pull
    expired), and the server holds no pull of it afterwards."""
    stream = topology.names.stream(n.STREAM_JOBS)
    durable = n.CONSUMER_SCHEDULER_JOBS

    async def handler(msg: Msg) -> None:
        await msg.ack()

    stop = asyncio.Event()
    task = asyncio.create_task(consume(
        js, stream=stream, durable=durable, handler=handler, in_hand=4, stop=stop,
        log=Log("test.consume"), fetch_wait=60.0, grace=5.0,
    ))  # fmt: skip
    try:
        await eventually(lambda: _waiting(js, stream, durable),
                         what="the consumer's pull waits at the server")  # fmt: skip
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert await _waiting(js, stream, durable) == 0


async def test_a_message_published_while_a_stopped_consumer_drains_goes_to_another_at_once(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """The stop gives up the waiting pull and unsubscribes before the drain: the server drops
    the pull, so a message published during the drain goes to another consumer at once. (A
    pull only cancelled on the client stays at the server until it expires and takes the next
    message to nobody: it would come back only after ``ack_wait``.)"""
    stream = topology.names.stream(n.STREAM_JOBS)
    durable = n.CONSUMER_SCHEDULER_JOBS
    held = asyncio.Event()
    release = asyncio.Event()
    handled: list[bytes] = []

    async def handler(msg: Msg) -> None:
        handled.append(msg.data)
        held.set()
        await release.wait()  # in flight through the drain
        await msg.ack()

    stop = asyncio.Event()
    # in_hand 2: beside the held message, a pull of one message, which lingers at the server
    task = asyncio.create_task(consume(
        js, stream=stream, durable=durable, handler=handler, in_hand=2, stop=stop,
        log=Log("test.consume"), fetch_wait=60.0, grace=30.0,
    ))  # fmt: skip
    other = await js.pull_subscribe_bind(durable=durable, stream=stream)
    try:
        await publish(js, topology.names.job_subject("held"), b"held", msg_id="d0")
        await asyncio.wait_for(held.wait(), 10)
        await eventually(lambda: _waiting(js, stream, durable),
                         what="the consumer pulls again beside the held message")  # fmt: skip
        stop.set()

        async def dropped() -> bool:
            return await _waiting(js, stream, durable) == 0

        # within half the ack wait: after it, the held message's redelivery would use up a
        # pull left at the server and hide it
        ack_wait = (await js.consumer_info(stream, durable)).config.ack_wait or 30.0
        await eventually(dropped, what="the server dropped the stopped consumer's pull",
                         timeout=ack_wait / 2)  # fmt: skip
        assert not task.done()  # still draining the held message
        await publish(js, topology.names.job_subject("late"), b"late", msg_id="d1")
        got = await other.fetch(1, timeout=5)
        assert [m.data for m in got] == [b"late"]
        await got[0].ack()
    finally:
        stop.set()
        release.set()
        await asyncio.wait_for(task, 10)
        await other.unsubscribe()
    assert handled == [b"held"]


async def _waiting(js: JetStreamContext, stream: str, durable: str) -> int:
    """The pulls the server holds for the consumer (``num_waiting``)."""
    return (await js.consumer_info(stream, durable)).num_waiting
