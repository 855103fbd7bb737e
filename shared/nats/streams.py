"""Queue depth and oldest-message age of every durable consumer, read from JetStream.

Per consumer, two requests: ``consumer_info`` (``num_pending``, ``num_ack_pending``, the ack
floor) and one ``get_msg`` of the first message after the ack floor that the consumer's filter
matches — by definition of the ack floor, that message is not yet acknowledged, so its stream
timestamp is the oldest pending message's age. The cost is bounded (two small requests per
consumer, independent of depth), so a collector may run this every few seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from proto.topology import Topology
from shared.nats.jetstream import retry_transient

__all__ = ["ConsumerStats", "StreamStats", "read_stats"]

READ_TIMEOUT = 3.0


@dataclass(frozen=True)
class ConsumerStats:
    """One durable consumer's backlog."""

    stream: str
    consumer: str
    pending: int
    ack_pending: int
    redelivered: int
    #: seconds since the oldest unacknowledged message was stored; 0 when there is none
    oldest_age: float


@dataclass(frozen=True)
class StreamStats:
    """Every stream's stored message count, and every consumer's backlog."""

    messages: dict[str, int]
    consumers: list[ConsumerStats]


async def read_stats(js: JetStreamContext, topology: Topology) -> StreamStats:
    """Read the message streams and their consumers (not the KV buckets)."""
    messages: dict[str, int] = {}
    for config in topology.message_streams():
        name = config.name or ""

        async def info(budget: float, stream: str = name) -> api.StreamInfo:
            return await js.stream_info(stream)

        found = await retry_transient(f"stream info {name}", info, timeout_total=READ_TIMEOUT)
        messages[name] = found.state.messages
    consumers = [
        await _consumer(js, stream, config.durable_name or "", config.filter_subject)
        for stream, config in topology.consumers()
    ]
    return StreamStats(messages, consumers)


async def _consumer(
    js: JetStreamContext, stream: str, name: str, filter_subject: str | None
) -> ConsumerStats:
    info = await retry_transient(
        f"consumer info {stream}/{name}",
        lambda budget: js.consumer_info(stream, name, timeout=budget),
        timeout_total=READ_TIMEOUT,
    )
    pending, ack_pending = info.num_pending or 0, info.num_ack_pending or 0
    age = 0.0
    if pending + ack_pending > 0:
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        age = await _age_after(js, stream, (floor or 0) + 1, filter_subject)
    return ConsumerStats(stream, name, pending, ack_pending, info.num_redelivered or 0, age)


async def _age_after(js: JetStreamContext, stream: str, seq: int, subject: str | None) -> float:
    async def attempt(budget: float) -> float:
        try:
            raw = await js.get_msg(stream, seq=seq, subject=subject or ">", next=True)
        except NotFoundError:
            return 0.0  # acknowledged between the two reads
        if raw.time is None:
            return 0.0
        return max(0.0, time.time() - raw.time.timestamp())

    return await retry_transient(f"oldest of {stream}", attempt, timeout_total=READ_TIMEOUT)
