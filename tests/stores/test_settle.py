"""The delivery wrapper and settle() on a real consumer: each outcome's action, at most once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from proto import names as n
from proto.topology import Topology
from shared.core.errors import (
    DecodeError,
    LeaseLost,
    RetryableError,
    StoreUnavailable,
    TerminalError,
)
from shared.core.lifecycle import IllegalTransition
from shared.core.retry import RetryPolicy
from shared.devstack.stack import Stack
from shared.nats.jetstream import publish
from shared.service.settle import (
    ACK,
    ACK_RECORDED,
    HAND_BACK,
    Ack,
    DeadLetter,
    Delivery,
    Leave,
    Retry,
    outcome_of,
    settle,
)
from tests.helpers import eventually


class Copies:
    """A DLQ copier that records what it was asked to copy and what the stream held then."""

    def __init__(self, js: JetStreamContext, stream: str) -> None:
        self.js, self.stream = js, stream
        self.letters: list[DeadLetter] = []
        self.original_present: list[bool] = []

    async def __call__(self, msg: Msg, letter: DeadLetter) -> None:
        self.letters.append(letter)
        try:
            await self.js.get_msg(self.stream, msg.metadata.sequence.stream)
            self.original_present.append(True)
        except NotFoundError:
            self.original_present.append(False)


@pytest.fixture
def stream(topology: Topology) -> str:
    return topology.names.stream(n.STREAM_TILES)


@pytest.fixture
async def fetch(js: JetStreamContext, topology: Topology, stream: str) -> AsyncIterator[object]:
    sub = await js.pull_subscribe_bind(n.CONSUMER_WORKERS, stream)

    async def one(tile: int = 0) -> Msg:
        subject = topology.names.tile_subject("job1", tile)
        await publish(js, subject, b"t", msg_id=f"tile:job1:{tile}:0")
        (msg,) = await sub.fetch(1, timeout=5)
        return msg

    yield one
    await sub.unsubscribe()


async def _pending(js: JetStreamContext, stream: str) -> tuple[int, int]:
    info = await js.consumer_info(stream, n.CONSUMER_WORKERS)
    return info.num_ack_pending, info.num_pending


async def test_ack_is_confirmed_once_and_a_later_settle_changes_nothing(js, stream, fetch):
    d = Delivery(await fetch(), Copies(js, stream))
    await settle(d, ACK)
    assert d.settled == "ack" and await _pending(js, stream) == (0, 0)
    await settle(d, Retry(0.0))  # a second settle of the same delivery: the first stands
    await d.in_progress()
    assert d.settled == "ack" and await _pending(js, stream) == (0, 0)


async def test_in_progress_is_sent_once_within_the_gap_its_caller_asks(js, nc, stream, fetch):
    """The heartbeats of a run's tiles share one message: due together, one reset is sent."""
    msg = await fetch()
    sent: list[bytes] = []

    async def seen(ack: Msg) -> None:
        sent.append(ack.data)

    watch = await nc.subscribe(msg.reply, cb=seen)  # what reaches the server's ack subject
    await nc.flush()
    d = Delivery(msg, Copies(js, stream))
    await d.in_progress(unless_within=60.0)
    await d.in_progress(unless_within=60.0)  # a second heartbeat of the same beat: not sent
    await d.in_progress()  # no gap asked for: sent
    await d.nak()  # (sent after them, on the same connection)
    await eventually(lambda: b"-NAK" in sent, timeout=5, what="the nak seen on its subject")
    await watch.unsubscribe()
    assert sent == [b"+WPI", b"+WPI", b"-NAK"]


async def test_an_unconfirmed_ack_is_sent_without_a_reply_and_settles_once(js, nc, stream, fetch):
    d = Delivery(await fetch(), Copies(js, stream))
    await settle(d, ACK_RECORDED)
    assert d.settled == "ack"
    await nc.flush()  # the ack is on the wire; the server applies it in order after the PING

    async def acked() -> bool:
        return await _pending(js, stream) == (0, 0)

    await eventually(acked, timeout=5, what="the unconfirmed ack applied")
    await settle(d, Retry(0.0))  # the first settle stands
    assert d.settled == "ack"


async def test_retry_naks_with_its_delay_and_hand_back_at_once(js, stream, fetch):
    sub = await js.pull_subscribe_bind(n.CONSUMER_WORKERS, stream)
    try:
        first = Delivery(await fetch(), Copies(js, stream))
        await settle(first, HAND_BACK)
        (again,) = await sub.fetch(1, timeout=5)
        assert again.metadata.num_delivered == 2, "handed back: redelivered at once"
        later = Delivery(again, Copies(js, stream))
        await settle(later, Retry(30.0))
        assert later.settled == "nak"
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)  # not within its delay
    finally:
        await sub.unsubscribe()


async def test_data_and_deliveries_are_the_messages(js, stream, fetch):
    # What tests/worker/test_tile_run_unit.py's FakeDelivery stands for, on a real consumer.
    sub = await js.pull_subscribe_bind(n.CONSUMER_WORKERS, stream)
    try:
        first = Delivery(await fetch(), Copies(js, stream))
        assert (first.data, first.deliveries) == (b"t", 1)
        await settle(first, HAND_BACK)
        (again,) = await sub.fetch(1, timeout=5)
        assert (Delivery(again, Copies(js, stream)).deliveries, again.data) == (2, b"t")
    finally:
        await sub.unsubscribe()


async def test_a_dead_letter_is_copied_and_recorded_before_the_term_deletes_it(js, stream, fetch):
    msg = await fetch()
    copies = Copies(js, stream)
    recorded: list[bool] = []

    async def record() -> None:
        try:
            await js.get_msg(stream, msg.metadata.sequence.stream)
            recorded.append(True)
        except NotFoundError:
            recorded.append(False)

    letter = DeadLetter("job1", n.dlq_unit_tile(0), DecodeError("garbage"), record)
    d = Delivery(msg, copies)
    await settle(d, letter)
    assert copies.letters == [letter] and copies.original_present == [True], "copy first"
    assert recorded == [True], "recorded before the term"

    async def deleted() -> bool:  # term deletes at once on a work-queue stream
        try:
            await js.get_msg(stream, msg.metadata.sequence.stream)
        except NotFoundError:
            return True
        return False

    await eventually(deleted, what="the term deletes the original")
    await settle(d, letter)
    assert len(copies.letters) == 1, "settled once: no second copy"


async def test_leave_settles_nothing(js, stream, fetch):
    d = Delivery(await fetch(), Copies(js, stream))
    await settle(d, Leave("fenced"))
    assert d.settled is None and await _pending(js, stream) == (1, 0)


async def test_a_closed_connection_is_our_store_unavailable(
    stack: Stack, js: JetStreamContext, stream: str, topology: Topology
):
    other = await nats.connect(stack.nats.url)
    await publish(js, topology.names.tile_subject("job1", 7), b"t", msg_id="tile:job1:7:0")
    sub = await other.jetstream().pull_subscribe_bind(n.CONSUMER_WORKERS, stream)
    (msg,) = await sub.fetch(1, timeout=5)
    await other.close()
    d = Delivery(msg, Copies(js, stream))
    for action in (d.in_progress(), d.nak(1.0), d.ack()):
        with pytest.raises(StoreUnavailable):
            await action
    assert d.settled is None


def test_exceptions_map_to_outcomes_in_one_table():
    policy = RetryPolicy(base=1.0, cap=8.0, jitter=0.0)

    def of(exc: RetryableError | TerminalError) -> object:
        return outcome_of(exc, retry=policy, deliveries=3, job_id="job1", unit="tile-0")

    assert of(IllegalTransition("done + cancel")) == Ack()
    assert of(LeaseLost("gone")) == Leave("lease_lost")
    terminal = DecodeError("garbage")
    assert of(terminal) == DeadLetter("job1", "tile-0", terminal)
    retryable = StoreUnavailable("db down")
    assert of(retryable) == Retry(4.0, retryable)
