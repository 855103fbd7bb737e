"""The consume loop every service shares: pull, dispatch to bounded concurrent handlers, drain.

Outcome → JetStream action lives in one place, :func:`shared.service.settle.settle`, which every
handler's typed outcome goes through; this loop only decides *how many* messages are in flight
and stops fetching when the service is asked to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import ServerError, ServiceUnavailableError

from shared.service.logs import Log

__all__ = ["FETCH_WAIT", "RETRY_PAUSE", "consume", "consume_many"]

Handler = Callable[[Msg], Awaitable[None]]

FETCH_WAIT = 5.0
"""How long one pull request waits at the server for a message (its ``expires``). A message
is delivered to a waiting pull at once, so this is only the period of an idle consumer's
requests: each costs a request and a 408 answer, a wake-up of the service and of nats-server.
At 1 s the embedded stack's six consumers made 5.5 requests a second and it idled at 16.4
core-ms/s; at 5 s, 2.3 requests and 11.5 core-ms/s (issue 19; ``python -m bench.idle`` compares
two trees). The stop does not wait for it (:func:`_fetch` races it); a pull lost with a
restarted server is waited out, at most this long."""
RETRY_PAUSE = 1.0
"""The pause before pulling again after the connection dropped or the server refused a pull."""


async def consume(
    js: JetStreamContext,
    *,
    stream: str,
    durable: str,
    handler: Handler,
    in_hand: int,
    stop: asyncio.Event,
    log: Log,
    fetch_wait: float = FETCH_WAIT,
    grace: float,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Hold up to ``in_hand`` messages of the durable pull consumer until ``stop`` is set.

    Each is handled by its own task; a new one is fetched whenever a handler finishes. A
    fetch asks for every free slot while messages are coming, for one while none came.

    ``stop`` ends a waiting fetch at once; the subscription is then closed before the drain, so
    the server drops the pull it still holds (no later message is delivered to it). In-flight
    handlers then get ``grace`` seconds to finish (``on_stop`` is called first so they can hand
    their work back; their acks and naks need no subscription); whatever is still running after
    that is cancelled.
    """
    sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    inflight: set[asyncio.Task[None]] = set()
    # ``on_stop`` runs as soon as ``stop`` is set, not when a pending fetch gives up (up to
    # ``fetch_wait`` later): in-flight work starts handing back at once.
    stopping = asyncio.create_task(_call_on(stop, on_stop)) if on_stop is not None else None
    busy = True
    try:
        while not stop.is_set():
            free = in_hand - len(inflight)
            if free <= 0:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            # Idle (the last fetch came back empty): wait for one message. nats-py fetches a
            # batch of more than one as two pull requests (a no-wait probe, then the wait),
            # so an idle consumer sent two requests and got two answers per ``fetch_wait``.
            msgs = await _fetch(sub, free if busy else 1, fetch_wait, stop, log, stream)
            busy = bool(msgs)
            if stop.is_set():  # fetched while stopping: hand back untouched, for others
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                break
            for msg in msgs:
                task = asyncio.create_task(_guarded(handler, msg, log))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
    finally:
        if stopping is not None:
            stopping.cancel()
        if on_stop is not None:
            on_stop()  # (again, if ``stop`` was set: it must be idempotent)
        await _close(sub)
        await _drain(inflight, grace, log)


async def consume_many(
    js: JetStreamContext,
    *,
    stream: str,
    durables: Sequence[str],
    handler: Handler,
    in_hand: int,
    stop: asyncio.Event,
    log: Log,
    fetch_wait: float = FETCH_WAIT,
    grace: float,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """:func:`consume` over several durable consumers of one stream, sharing ``in_hand``.

    One fetcher per consumer. A fetcher whose last fetch brought messages reserves every free
    slot for its next fetch (a busy consumer keeps the worker full, as with one consumer); one
    whose last fetch came back empty probes for a single message without reserving, so idle
    consumers never hold slots a busy one could use. A probe that brings a message while the
    others filled the slots can exceed ``in_hand`` by one: at most ``in_hand + len(durables) -
    1`` messages are in hand. With one consumer this is :func:`consume`.
    """
    if len(durables) == 1:
        await consume(js, stream=stream, durable=durables[0], handler=handler, in_hand=in_hand,
                      stop=stop, log=log, fetch_wait=fetch_wait, grace=grace,
                      on_stop=on_stop)  # fmt: skip
        return
    subs = [await js.pull_subscribe_bind(durable=d, stream=stream) for d in durables]
    shared = _Shared(handler, in_hand, stop, log, stream, fetch_wait)
    stopping = asyncio.create_task(_call_on(stop, on_stop)) if on_stop is not None else None
    waking = asyncio.create_task(_call_on(stop, shared.changed.set))
    fetchers = [asyncio.create_task(shared.fetcher(sub)) for sub in subs]
    try:
        await asyncio.gather(*fetchers)
    finally:
        for task in (*fetchers, waking):
            task.cancel()
        await asyncio.gather(*fetchers, waking, return_exceptions=True)
        if stopping is not None:
            stopping.cancel()
        if on_stop is not None:
            on_stop()  # (again, if ``stop`` was set: it must be idempotent)
        for sub in subs:
            await _close(sub)
        await _drain(shared.inflight, grace, log)


class _Shared:
    """The in-hand budget several fetchers of :func:`consume_many` share."""

    def __init__(
        self,
        handler: Handler,
        in_hand: int,
        stop: asyncio.Event,
        log: Log,
        stream: str,
        fetch_wait: float,
    ) -> None:
        self.handler, self.in_hand, self.stop, self.log = handler, in_hand, stop, log
        self.stream, self.fetch_wait = stream, fetch_wait
        self.inflight: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()  # set whenever a slot may have come free (or stop)
        self.reserved = 0  # slots busy fetchers asked for and have not got yet

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        self.changed.set()

    async def fetcher(self, sub: JetStreamContext.PullSubscription) -> None:
        """Fetch from ``sub`` while there is room, until ``stop``."""
        busy = True
        while True:
            self.changed.clear()  # (before the check: a slot freed after it sets it again)
            if self.stop.is_set():
                return
            free = self.in_hand - len(self.inflight) - self.reserved
            if free <= 0:
                await self.changed.wait()
                continue
            want = free if busy else 1
            self.reserved += want if busy else 0
            try:
                msgs = await _fetch(sub, want, self.fetch_wait, self.stop, self.log, self.stream)
            finally:
                self.reserved -= want if busy else 0
                self.changed.set()
            busy = bool(msgs)
            if self.stop.is_set():  # fetched while stopping: hand back untouched, for others
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.nak()
                return
            for msg in msgs:
                task = asyncio.create_task(_guarded(self.handler, msg, self.log))
                self.inflight.add(task)
                task.add_done_callback(self._done)


async def _fetch(
    sub: JetStreamContext.PullSubscription,
    batch: int,
    wait: float,
    stop: asyncio.Event,
    log: Log,
    stream: str,
) -> list[Msg]:
    """Up to ``batch`` messages; none when nothing came within ``wait``, the server is not
    answering, or ``stop`` was set first (the pull is given up; what it had already brought is
    returned, for the caller to hand back)."""
    pull = asyncio.ensure_future(sub.fetch(batch=batch, timeout=wait))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((pull, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        while not pull.done():  # (nats-py may swallow a cancel: then the pull ends by itself)
            pull.cancel()
            await asyncio.wait((pull,))
    if pull.cancelled():
        return []
    try:
        return pull.result()
    except (TimeoutError, nats.errors.TimeoutError):
        return []
    except (nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError):
        await _pause(stop, RETRY_PAUSE)
        return []
    except (ServiceUnavailableError, ServerError) as exc:
        # 503/500 while the consumer's stream elects a new leader (a cluster lost a node): the
        # consumer comes back within seconds, so wait and pull again.
        log.warning("fetch refused; retrying", stream=stream, error=repr(exc))
        await _pause(stop, RETRY_PAUSE)
        return []


async def _close(sub: JetStreamContext.PullSubscription) -> None:
    """Unsubscribe: the server then drops a pull of ours it still holds (one a stop gave up),
    where it would deliver the next message to nobody until ``ack_wait`` redelivered it."""
    with contextlib.suppress(Exception):
        await sub.unsubscribe()


async def _drain(inflight: set[asyncio.Task[None]], grace: float, log: Log) -> None:
    """Give ``inflight`` handlers ``grace`` seconds, then cancel what is left and wait for it."""
    if not inflight:
        return
    log.info("draining", inflight=len(inflight), grace=grace)
    _done, pending = await asyncio.wait(inflight, timeout=grace)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def _call_on(stop: asyncio.Event, on_stop: Callable[[], None]) -> None:
    await stop.wait()
    on_stop()


async def _guarded(handler: Handler, msg: Msg, log: Log) -> None:
    try:
        await handler(msg)
    except asyncio.CancelledError:
        raise
    except Exception:
        # A bug in a handler must not kill the loop; the message is redelivered after ack_wait.
        log.error("handler crashed", subject=msg.subject, exc=True)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
