"""The NATS/JetStream adapter: connection, bounded publish retries, bounded acks.

nats-py does not retry a JetStream publish that is answered 503 (no responders during a leader
election) or that times out, and an ack sent to a dead leader is lost (see NATS-NOTES). This
module wraps those calls in a bounded retry and translates what is left into our error tree:

===========================================  ==============================================
nats-py                                      Tessera
===========================================  ==============================================
503, no responders, timeouts, reconnecting   retried until ``timeout_total``, then
409 "message id is in process" (10158)       :class:`~shared.core.errors.StoreUnavailable`
connection closed or draining                :class:`~shared.core.errors.StoreUnavailable` at once
400 "wrong last sequence" (10071, 10164)     :class:`WrongLastSequence` (never retried)
any other JetStream API error                :class:`PublishRejected` (never retried)
===========================================  ==============================================

A retried publish keeps the same ``Nats-Msg-Id``, so a first try that did land is absorbed by the
server's duplicate window. On a replicated stream, a publish that reaches the leader while an
earlier one with the same id is still being replicated is answered 409 "in process" (10158); a
later try is answered with a duplicate ack (or stores the message, if the earlier proposal was
lost with a leader), so it is retried like a 503. A retried *conditional* publish
(``Nats-Expected-Last-Subject-Sequence``) whose first try landed fails with "wrong last
sequence" instead (the check runs before dedup): the caller must re-read to find out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from proto.messages import Message
from shared.core.config import Settings
from shared.core.errors import ConflictError, StoreUnavailable, TerminalError
from shared.core.retry import RetryPolicy, backoff

__all__ = [
    "TRANSIENT_RETRY",
    "PublishRejected",
    "WrongLastSequence",
    "ack_sync_retry",
    "connect_nats",
    "publish",
    "publish_unconfirmed",
    "redact_url",
    "retry_transient",
    "subjects_with_messages",
    "translate_api_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

ERR_WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream error codes of a failed ``Nats-Expected-Last-*`` check."""

ERR_IN_PROCESS = (10158,)
"""JetStream error codes after which the same request may succeed a moment later: 10158, "duplicate
message id is in process" (an earlier publish of the id is not yet replicated)."""

TRANSIENT: tuple[type[BaseException], ...] = (
    ServiceUnavailableError,  # 503: no leader (election) or JetStream busy
    ServerError,  # 500: e.g. a replica catching up; a later try may succeed
    NoStreamResponseError,  # no stream answered (election, or no stream yet)
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    asyncio.TimeoutError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,  # disconnected long enough to fill the buffer
)
"""nats-py errors after which the same request may succeed a moment later."""

GONE: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
)
"""The connection will never answer again: retrying is pointless."""


class WrongLastSequence(ConflictError):
    """A conditional write found another last revision: someone else wrote (or it expired).

    After a retried write this can also mean *our* first try landed; re-read to tell.
    """

    code = "wrong_last_sequence"


class PublishRejected(TerminalError):
    """JetStream refused the message for a reason retrying cannot fix (size, config, ...)."""

    code = "publish_rejected"

    def __init__(self, message: str, *, err_code: int | None) -> None:
        super().__init__(message)
        self.err_code = err_code


#: pauses between tries of a JetStream call: 50 ms doubling to 1 s, -20 % jitter
TRANSIENT_RETRY = RetryPolicy(base=0.05, cap=1.0, jitter=0.2)


async def retry_transient(
    what: str,
    attempt: Callable[[float], Awaitable[T]],
    *,
    timeout_total: float,
    attempt_timeout: float = 2.0,
    policy: RetryPolicy = TRANSIENT_RETRY,
) -> T:
    """Run ``attempt(timeout)`` until it succeeds, retrying :data:`TRANSIENT` errors.

    Each try gets at most ``attempt_timeout`` seconds (less near the end of the budget); after
    ``timeout_total`` seconds the last error is raised as :class:`StoreUnavailable`. An API error
    whose code is in :data:`ERR_IN_PROCESS` is retried too. Any other exception propagates
    unchanged (the caller translates it).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_total
    tries = 0
    while True:
        budget = min(attempt_timeout, max(deadline - loop.time(), 0.05))
        try:
            return await attempt(budget)
        except GONE as exc:
            raise StoreUnavailable(f"{what}: the NATS connection is closed") from exc
        except TRANSIENT as exc:
            last = exc
        except APIError as exc:
            if exc.err_code not in ERR_IN_PROCESS:
                raise
            last = exc
        pause = backoff(policy, tries + 1)
        if loop.time() + pause >= deadline:
            raise StoreUnavailable(
                f"{what}: no answer from JetStream within {timeout_total:g} s "
                f"({tries + 1} tries, last: {last!r})"
            ) from last
        tries += 1
        log.debug("%s: retrying after %r", what, last)
        await asyncio.sleep(pause)


async def publish_unconfirmed(
    nc: Client, subject: str, payload: Message, *, msg_id: str | None
) -> None:
    """Publish ``payload`` without waiting for the server: to a stream's subject with its
    headers and ``Nats-Msg-Id`` (the stream stores it and absorbs a repeat), or, with
    ``msg_id=None``, to a core-NATS subject no stream captures (headers only).

    Only for a notification nothing depends on receiving: the message is handed to the
    connection's buffer (kept across a reconnect, flushed in order with what the connection
    sends after it), and lost only with the connection or the server. Raises
    :class:`StoreUnavailable` when the connection is closed, or cannot take the message now
    (disconnected long enough to fill its buffer).
    """
    headers = dict(payload.headers())
    if msg_id is not None:
        headers[api.Header.MSG_ID] = msg_id
    try:
        await nc.publish(subject, payload.encode(), headers=headers)
    except GONE as exc:
        raise StoreUnavailable(f"publish to {subject}: the NATS connection is closed") from exc
    except TRANSIENT as exc:
        raise StoreUnavailable(f"publish to {subject}: {exc!r}") from exc


async def publish(
    js: JetStreamContext,
    subject: str,
    payload: bytes | Message,
    *,
    msg_id: str | None,
    headers: Mapping[str, str] | None = None,
    msg_ttl: int | None = None,
    timeout_total: float = 15.0,
    attempt_timeout: float = 2.0,
) -> api.PubAck:
    """Publish to a stream, retrying transient failures with the same ``Nats-Msg-Id``.

    ``payload`` is raw bytes or an internal :class:`~proto.messages.Message`, which is sent
    encoded with its readable ``Tessera-*`` headers (:meth:`~proto.messages.Message.headers`)
    merged over ``headers``; ``Nats-Msg-Id`` is set last, so nothing overrides it.
    ``msg_id`` is required by keyword so every caller decides about de-duplication (``None``
    only for writes that are fenced otherwise, such as KV compare-and-set). ``msg_ttl`` is the
    per-message TTL in whole seconds (the stream must allow it). Returns the ``PubAck``;
    ``ack.duplicate`` is ``True`` when the server absorbed the message as a duplicate.

    Raises :class:`StoreUnavailable` after ``timeout_total``, :class:`WrongLastSequence` when an
    expected-sequence header does not match, :class:`PublishRejected` for other refusals.
    """
    if msg_ttl is not None and (
        isinstance(msg_ttl, bool) or int(msg_ttl) != msg_ttl or msg_ttl < 1
    ):
        raise ValueError(f"msg_ttl={msg_ttl!r}: per-message TTLs are whole seconds >= 1")
    base = dict(headers or {})
    if isinstance(payload, Message):
        base.update(payload.headers())
        body = payload.encode()
    else:
        body = payload
    if msg_id is not None:
        base[api.Header.MSG_ID] = msg_id

    async def attempt(budget: float) -> api.PubAck:
        # js.publish adds the TTL header to the dict it is given: hand it a fresh copy.
        hdrs = dict(base) or None
        return await js.publish(subject, body, timeout=budget, headers=hdrs, msg_ttl=msg_ttl)

    try:
        ack = await retry_transient(
            f"publish to {subject}",
            attempt,
            timeout_total=timeout_total,
            attempt_timeout=attempt_timeout,
        )
    except APIError as exc:
        raise translate_api_error(f"publish to {subject}", exc) from exc
    if ack.duplicate:
        log.debug("publish to %s: duplicate of seq %s (msg id %s)", subject, ack.seq, msg_id)
    return ack


SUBJECT_DETAILS_LIMIT = 100_000
"""Most subjects one ``STREAM.INFO`` reply lists (the server's limit; more are paged)."""


async def subjects_with_messages(
    js: JetStreamContext, stream: str, subjects_filter: str, *, timeout_total: float = 15.0
) -> dict[str, int] | None:
    """``subject -> messages stored`` for the subjects of ``stream`` matching the filter.

    One ``STREAM.INFO`` request, whatever the number of subjects (about 75 bytes of reply per
    listed subject): the bulk form of "is there a message on this subject?". ``None`` when the
    reply may be incomplete (the server lists at most :data:`SUBJECT_DETAILS_LIMIT` subjects):
    ask per subject then. Retried like any read; raises :class:`StoreUnavailable` after
    ``timeout_total``.
    """

    async def attempt(budget: float) -> api.StreamInfo:
        return await asyncio.wait_for(js.stream_info(stream, subjects_filter), budget)

    what = f"subjects of {stream} matching {subjects_filter}"
    try:
        info = await retry_transient(what, attempt, timeout_total=timeout_total)
    except NotFoundError as exc:  # the stream itself: its declaration is gone
        raise StoreUnavailable(f"{what}: stream {stream} does not exist") from exc
    except APIError as exc:
        raise translate_api_error(what, exc) from exc
    subjects = dict(info.state.subjects or {})
    return None if len(subjects) >= SUBJECT_DETAILS_LIMIT else subjects


def translate_api_error(what: str, exc: APIError) -> TerminalError:
    """A non-transient JetStream API error as our error (wrong last sequence or rejected)."""
    if exc.err_code in ERR_WRONG_LAST_SEQUENCE:
        return WrongLastSequence(f"{what}: {exc.description}")
    return PublishRejected(
        f"{what}: JetStream refused (code {exc.code}, err {exc.err_code}): {exc.description}",
        err_code=exc.err_code,
    )


async def ack_sync_retry(
    msg: Msg, *, timeout_total: float = 10.0, attempt_timeout: float = 1.0
) -> None:
    """Acknowledge ``msg`` and wait for the server's confirmation, retrying until it comes.

    An ack sent to a leader that just died is lost; a repeated ack of an acked message is
    confirmed again by the server, so retrying is safe. Raises :class:`StoreUnavailable` when
    no confirmation arrives within ``timeout_total`` or the connection is closed. A message this
    client already acked, nak'ed or termed raises nats-py's ``MsgAlreadyAckdError`` (a bug in the
    caller, not a runtime condition).
    """

    async def attempt(budget: float) -> None:
        await msg.ack_sync(timeout=budget)

    await retry_transient(
        f"ack of {msg.subject}",
        attempt,
        timeout_total=timeout_total,
        attempt_timeout=attempt_timeout,
    )


def redact_url(url: str) -> str:
    """``url`` without the password of ``nats://user:password@host:port`` (for logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{parts.netloc.rsplit('@')[-1]}"))


async def connect_nats(
    settings: Settings,
    *,
    name: str,
    connect_within: float = 10.0,
    ping_interval: int = 5,
    reconnect_time_wait: float = 0.5,
) -> Client:
    """Connect to every server of ``settings.nats_urls``; reconnect forever afterwards.

    The first connection must succeed within ``connect_within`` seconds, else
    :class:`StoreUnavailable` (nats-py itself would retry forever with unlimited reconnects).
    Errors reported asynchronously by the server — notably **permissions violations**, which
    otherwise only look like timeouts — are logged at ERROR level, disconnects at WARNING.
    """
    client = Client()

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if "permissions violation" in text.lower():
            log.error(
                "NATS %s: PERMISSIONS VIOLATION (check the user's allow lists): %s", name, text
            )
        elif isinstance(exc, OSError | nats.errors.StaleConnectionError):
            log.warning("NATS %s: connection problem: %r", name, exc)  # reconnect follows
        else:
            log.error("NATS %s: %s: %s", name, type(exc).__name__, text)

    async def on_disconnected() -> None:
        if client.is_closed or client.is_draining:
            log.debug("NATS %s: disconnected (closing)", name)  # our own close(): no news
        else:
            log.warning("NATS %s: disconnected; reconnecting", name)

    async def on_reconnected() -> None:
        url = client.connected_url
        where = f"{url.hostname}:{url.port}" if url else "?"  # never the credentials
        log.warning("NATS %s: reconnected to %s", name, where)

    async def on_closed() -> None:
        log.info("NATS %s: connection closed", name)

    connect = client.connect(
        servers=list(settings.nats_urls),
        name=name,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        closed_cb=on_closed,
        max_reconnect_attempts=-1,
        reconnect_time_wait=reconnect_time_wait,  # type: ignore[arg-type]  # float works
        connect_timeout=2,
        ping_interval=ping_interval,
        max_outstanding_pings=2,
    )
    try:
        await asyncio.wait_for(connect, connect_within)
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        await client.close()
        urls = ",".join(redact_url(u) for u in settings.nats_urls)
        raise StoreUnavailable(f"NATS at {urls} did not accept a connection: {exc!r}") from exc
    return client
