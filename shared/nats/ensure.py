"""Create or update the whole topology, idempotently and race-safely.

Every service calls :func:`ensure_topology` at start-up, possibly at the same moment. Each object
is read first and left alone when it already matches, so a user allowed only ``INFO`` (see
:mod:`shared.devstack.natsauth`) starts once the topology owner has declared it. Otherwise, for each
stream: ``add_stream`` (a no-op when the config is identical); if the server answers "already in
use with a different configuration" (10058), ``update_stream``; then read it back and verify every
field we set. Consumers use ``add_consumer``, which creates or updates, and are verified the same
way. Descriptions are fields like any other: a topology declared before it had them is updated in
place (messages and consumer positions kept), and an older service, whose configs set none, does
not compare them and leaves them be. A concurrent creator can make one step fail transiently,
so each object gets a few attempts.
A config the server refuses to change (retention to/from work-queue, a consumer's deliver policy)
raises :class:`~shared.core.errors.ConfigError` naming the object; an unreachable server raises
:class:`~shared.core.errors.StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from proto import names as n
from proto.topology import Topology
from shared.core.errors import ConfigError, StoreUnavailable
from shared.core.retry import RetryPolicy, backoff

ATTEMPTS = 5
#: pauses between attempts: 50 ms doubling (0.05 .. 0.4 s), -20 % jitter
ENSURE_RETRY = RetryPolicy(base=0.05, cap=0.4, jitter=0.2)
ERR_STREAM_NAME_IN_USE = 10058
_TRANSIENT = (asyncio.TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError)

T = TypeVar("T")


async def ensure_topology(js: JetStreamContext, topology: Topology) -> None:
    """Create or update every stream, KV bucket and consumer of ``topology``."""
    for stream in topology.streams():
        await _attempts(f"stream {stream.name}", partial(_ensure_stream, js, stream))
    for stream_name, consumer in topology.consumers():
        what = f"consumer {stream_name}/{consumer.name}"
        await _attempts(what, partial(_ensure_consumer, js, stream_name, consumer))
    await _purge_legacy_tiles(js, topology)


async def _purge_legacy_tiles(js: JetStreamContext, topology: Topology) -> None:
    """Drop TILES messages of the subject form before renderers (``tessera.tiles.<job>.<i>``).

    The ``workers`` consumer is filtered to ``tessera.tiles.tessera.>`` now, so nothing would
    ever read them; their tiles have no message under their renderer's subject, so the sweeper
    re-publishes them (DESIGN "Sweeper"). Asked first, so a read-only user purges only when
    there is something to purge; a user without the permission (any but the topology owner) is
    refused, or its request times out, and leaves the purge to the owner.
    """
    tiles = topology.names.stream(n.STREAM_TILES)
    legacy = topology.names.legacy_tile_subjects
    try:
        info = await js.stream_info(tiles, subjects_filter=legacy)
    except (NotFoundError, *_TRANSIENT):
        return
    if info.state.subjects:
        try:
            await js.purge_stream(tiles, subject=legacy)
        except (APIError, *_TRANSIENT):
            return


async def _attempts(what: str, step: Callable[[], Awaitable[T]]) -> T:
    """Run ``step``; retry transient failures and verification races a bounded number of times."""
    last: Exception | None = None
    for attempt in range(ATTEMPTS):
        try:
            return await step()
        except (*_TRANSIENT, ServiceUnavailableError, NotFoundError, _Mismatch) as exc:
            # NotFound right after a create: on a cluster, another service's concurrent create
            # is committed but the stream or consumer is not placed yet.
            last = exc
        if attempt + 1 < ATTEMPTS:
            await asyncio.sleep(backoff(ENSURE_RETRY, attempt + 1))
    if isinstance(last, _Mismatch):
        raise ConfigError(f"{what}: server config differs after update: {last}")
    raise StoreUnavailable(f"{what}: JetStream did not answer: {last!r}") from last


class _Mismatch(Exception):
    """The server's config differs from ours (possibly a concurrent writer: try again)."""


async def _ensure_stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    assert config.name is not None
    if await _stream_matches(js, config):
        return  # read-only users (see shared/devstack/natsauth.py) need nothing more
    try:
        await js.add_stream(config)
    except APIError as exc:
        if exc.err_code != ERR_STREAM_NAME_IN_USE:
            raise _config_error(f"stream {config.name}", exc) from exc
        try:
            await js.update_stream(config)
        except APIError as upd:
            if isinstance(upd, ServiceUnavailableError):
                raise
            raise _config_error(f"stream {config.name}", upd) from upd
    info = await js.stream_info(config.name)
    _verify(config, info.config, _STREAM_IGNORED)
    if info.config.subject_delete_marker_ttl:  # breaks nats-py get()/create() on leases
        raise _Mismatch(f"subject_delete_marker_ttl={info.config.subject_delete_marker_ttl}")


async def _stream_matches(js: JetStreamContext, config: api.StreamConfig) -> bool:
    assert config.name is not None
    try:
        info = await js.stream_info(config.name)
        _verify(config, info.config, _STREAM_IGNORED)
    except (NotFoundError, _Mismatch):
        return False
    return not info.config.subject_delete_marker_ttl


async def _ensure_consumer(js: JetStreamContext, stream: str, config: api.ConsumerConfig) -> None:
    assert config.name is not None
    if await _consumer_matches(js, stream, config):
        return
    try:
        await js.add_consumer(stream, config)
    except APIError as exc:
        if isinstance(exc, ServiceUnavailableError):
            raise
        raise _config_error(f"consumer {stream}/{config.name}", exc) from exc
    info = await js.consumer_info(stream, config.name)
    _verify(config, info.config, frozenset())
    if info.config.backoff or info.config.inactive_threshold:
        raise _Mismatch(f"backoff={info.config.backoff} inactive={info.config.inactive_threshold}")


async def _consumer_matches(js: JetStreamContext, stream: str, config: api.ConsumerConfig) -> bool:
    assert config.name is not None
    try:
        info = await js.consumer_info(stream, config.name)
        _verify(config, info.config, frozenset())
    except (NotFoundError, _Mismatch):
        return False
    return not (info.config.backoff or info.config.inactive_threshold)


def _config_error(what: str, exc: APIError) -> Exception:
    if isinstance(exc, ServiceUnavailableError | NotFoundError):  # retried by _attempts
        return exc
    return ConfigError(f"{what}: server refused config (err {exc.err_code}): {exc.description}")


_STREAM_IGNORED = frozenset({"metadata"})
"""Fields the server rewrites on its own (it adds ``_nats.*`` metadata)."""


def _verify(wanted: Any, actual: Any, ignored: frozenset[str]) -> None:
    """Raise :class:`_Mismatch` if a field we set (not None) differs on the server."""
    for name, value in vars(wanted).items():
        if value is None or name in ignored:
            continue
        got = getattr(actual, name)
        if isinstance(value, float) and isinstance(got, float | int) and abs(value - got) < 1e-6:
            continue
        if _plain(value) != _plain(got):
            raise _Mismatch(f"{name}: wanted {value!r}, server has {got!r}")


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return sorted(_plain(v) for v in value)
    return getattr(value, "value", value)
