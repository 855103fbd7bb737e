"""Internal message schemas: small, frozen, versioned msgpack maps that carry references.

Every message is a msgpack map ``{"v": <version>, <field>: <value>, ...}``. :meth:`Message.decode`
is strict: bytes that are not msgpack, not a map, of an unknown version, missing a field, with an
unknown field, or with a field of the wrong type (a bool is not an int; a nested map is not a
string) raise :class:`~shared.core.errors.DecodeError` whose message names what was wrong — never
any other exception. A change of meaning gets a new field or a new version, never a reused field.

Limits: an encoded message is at most :data:`MAX_MESSAGE_BYTES`; strings at most
:data:`MAX_STR` characters (``detail`` and ``error``: :data:`MAX_TEXT`); ints are
``0 <= n < 2**63``; ids are tokens (see :mod:`proto.names`).

====================  ===========================================================================
class                 fields
====================  ===========================================================================
``JobMessage``        job_id, generation                        (``JOBS``, to the scheduler)
``TileMessage``       job_id, tile_index, generation            (``TILES``, to the workers)
``TileDone``          job_id, tile_index, attempt_id, result_key, input_hash   (``EVENTS``)
``TilesDone``         job_id, completion            (``EVENTS``, to the finalizer)
``JobEvent``          job_id, kind, generation, detail, result_key | None      (``EVENTS``)
``DeadLetter``        job_id, unit, reason, error, source_stream, source_seq, deliveries,
                      subject, payload (the original message bytes)            (``DLQ``)
``Room``              tiles                       (core NATS ``tessera.room``, to the dispatchers)
====================  ===========================================================================

:meth:`Message.headers` names a message in readable NATS headers (``Tessera-Kind``,
``Tessera-Job``, ...: see :mod:`proto.names`); :func:`shared.nats.jetstream.publish` sends them with
every message, so ``nats stream view`` shows what each one is without decoding it. Headers are
derived from the body and never read back:

====================  ===========================================================================
class                 headers
====================  ===========================================================================
``JobMessage``        Kind ``job``, Job, Generation
``TileMessage``       Kind ``tile``, Job, Tile, Generation
``TileDone``          Kind ``tile-done``, Job, Tile, Attempt
``TilesDone``         Kind ``tiles-done``, Job
``JobEvent``          Kind (the event kind, e.g. ``job-completed``), Job, Generation
``DeadLetter``        Kind ``dead-letter``, Job, Unit, Tile (``tile-<i>`` units), Reason, Source
                      (``<stream>:<seq>``), Deliveries
``Room``              Kind ``room``
====================  ===========================================================================
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import msgpack

from proto import names as n
from proto.names import TOKEN_RE, EventKind
from shared.core.errors import DecodeError
from shared.core.fields import field_names
from shared.core.runs import MAX_RUN

MAX_MESSAGE_BYTES = 64 * 1024
MAX_STR = 1024
MAX_TEXT = 8192
MAX_INT = 2**63 - 1

_TOKEN_FIELDS = frozenset({"job_id", "attempt_id", "unit", "source_stream"})
_TEXT_FIELDS = frozenset({"detail", "error"})


class Message:
    """Base of every internal message: ``encode()`` and a strict ``decode()``."""

    VERSION: ClassVar[int] = 1
    #: fields left out of the body while they hold this default (their dataclass default): a
    #: field added later, so a message that does not use it is the bytes a reader from before
    #: it accepts
    OMITTED_AT_DEFAULT: ClassVar[Mapping[str, object]] = {}

    def headers(self) -> dict[str, str]:
        """Readable NATS headers naming this message (``Tessera-Kind``, ``Tessera-Job``, ...)."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """msgpack bytes of this message, ``v`` first."""
        # Every field is a scalar (str, int, bytes, an EventKind): a shallow map is the whole
        # message (``dataclasses.asdict`` would deep-copy each field, once per tile).
        body: dict[str, Any] = {"v": self.VERSION}
        for name in field_names(type(self)):
            value = getattr(self, name)
            if name in self.OMITTED_AT_DEFAULT and value == self.OMITTED_AT_DEFAULT[name]:
                continue
            body[name] = value.value if isinstance(value, EventKind) else value
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """Parse ``data`` or raise :class:`DecodeError` naming the problem."""
        name = cls.__name__
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"{name}: expected bytes, got {type(data).__name__}")
        if len(data) > MAX_MESSAGE_BYTES:
            raise DecodeError(f"{name}: {len(data)} bytes exceeds limit {MAX_MESSAGE_BYTES}")
        try:
            body = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises many unrelated types for garbage
            raise DecodeError(f"{name}: not msgpack ({type(exc).__name__})") from exc
        if not isinstance(body, dict):
            raise DecodeError(f"{name}: expected a map, got {type(body).__name__}")
        return cls._from_map(body)

    @classmethod
    def _from_map(cls, body: dict[Any, Any]) -> Self:
        name = cls.__name__
        version = body.get("v")
        if type(version) is not int or version != cls.VERSION:
            raise DecodeError(f"{name}: unknown version v={version!r} (expected {cls.VERSION})")
        fields = _field_types(cls)
        extra = sorted(repr(k) for k in body if k != "v" and k not in fields)
        if extra:
            raise DecodeError(f"{name}: unknown field(s) {', '.join(extra)}")
        values = {f: _check(name, f, t, body[f]) for f, t in fields.items() if f in body}
        missing = [f for f in fields if f not in values and f not in _defaults(cls)]
        if missing:
            raise DecodeError(f"{name}: missing field(s) {', '.join(missing)}")
        try:
            return cls(**values)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"{name}: {exc}") from exc


_HEADER_UNSAFE = re.compile(r"[^\x21-\x7e]+")
MAX_HEADER_VALUE = 128


def header_value(value: str | int) -> str:
    """``value`` as a header value: printable ASCII without spaces, CR or LF, 1..128 long."""
    return _HEADER_UNSAFE.sub("_", str(value))[:MAX_HEADER_VALUE] or "-"


_FIELD_TYPES: dict[type, dict[str, Any]] = {}
"""Resolved field types per message class: resolving annotations is dearer than decoding."""


def _field_types(cls: type) -> dict[str, Any]:
    cached = _FIELD_TYPES.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return cached


def _defaults(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _check(msg: str, field: str, expected: Any, value: Any) -> Any:
    """Return ``value`` converted to ``expected`` or raise a DecodeError naming the field."""
    if isinstance(expected, types.UnionType):  # ``X | None``
        if value is None:
            return None
        expected = next(t for t in typing.get_args(expected) if t is not type(None))
    where = f"{msg}.{field}"
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
            raise DecodeError(f"{where}: expected an integer in 0..{MAX_INT}, got {value!r:.60}")
        return value
    if expected is bytes:
        if not isinstance(value, bytes):
            raise DecodeError(f"{where}: expected bytes, got {type(value).__name__}")
        return value
    if expected is EventKind:
        try:
            return EventKind(value)
        except ValueError:
            raise DecodeError(f"{where}: unknown event kind {value!r:.60}") from None
    return _check_str(where, field, value)


def _check_str(where: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"{where}: expected a string, got {type(value).__name__}")
    limit = MAX_TEXT if field in _TEXT_FIELDS else MAX_STR
    if len(value) > limit:
        raise DecodeError(f"{where}: {len(value)} characters exceeds limit {limit}")
    if field in _TOKEN_FIELDS and TOKEN_RE.fullmatch(value) is None:
        raise DecodeError(f"{where}: {value!r:.60} is not a token matching {TOKEN_RE.pattern}")
    return value


@dataclass(frozen=True, slots=True)
class JobMessage(Message):
    """A job to plan (``JOBS``). ``generation`` grows with every retry of the job."""

    job_id: str
    generation: int = 0

    def headers(self) -> dict[str, str]:
        """Kind ``job``, job id and generation."""
        return {
            n.HDR_KIND: n.KIND_JOB,
            n.HDR_JOB: header_value(self.job_id),
            n.HDR_GENERATION: header_value(self.generation),
        }


@dataclass(frozen=True, slots=True)
class TileMessage(Message):
    """One tile to render (``TILES``). The sweeper re-publishes with a larger ``generation``."""

    job_id: str
    tile_index: int
    generation: int = 0
    #: tiles the message carries: ``tile_index`` and the ``run - 1`` indexes after it, all at
    #: ``generation`` (a run of tiny tiles shares one message; see docs/architecture.md)
    run: int = 1

    OMITTED_AT_DEFAULT: ClassVar[Mapping[str, object]] = {"run": 1}

    def __post_init__(self) -> None:
        if not 1 <= self.run <= MAX_RUN:
            raise ValueError(f"run {self.run} is outside 1..{MAX_RUN}")

    @property
    def tiles(self) -> range:
        """The tile indexes the message carries."""
        return range(self.tile_index, self.tile_index + self.run)

    def single(self, tile_index: int) -> TileMessage:
        """The message of one of the tiles this one carries."""
        if tile_index not in self.tiles:
            raise ValueError(f"tile {tile_index} is not in the run {self.tiles}")
        return TileMessage(self.job_id, tile_index, self.generation)

    def headers(self) -> dict[str, str]:
        """Kind ``tile``, job id, tile index and generation (and ``Tessera-Run`` for a run of
        several tiles)."""
        headers = {
            n.HDR_KIND: n.KIND_TILE,
            n.HDR_JOB: header_value(self.job_id),
            n.HDR_TILE: header_value(self.tile_index),
            n.HDR_GENERATION: header_value(self.generation),
        }
        if self.run > 1:
            headers[n.HDR_RUN] = header_value(self.run)
        return headers


@dataclass(frozen=True, slots=True)
class TileDone(Message):
    """A tile's result is committed; ``result_key`` names the object, ``input_hash`` its inputs."""

    job_id: str
    tile_index: int
    attempt_id: str
    result_key: str
    input_hash: str

    def headers(self) -> dict[str, str]:
        """Kind ``tile-done``, job id, tile index and the attempt that rendered it."""
        return {
            n.HDR_KIND: EventKind.TILE_DONE.value,
            n.HDR_JOB: header_value(self.job_id),
            n.HDR_TILE: header_value(self.tile_index),
            n.HDR_ATTEMPT: header_value(self.attempt_id),
        }


@dataclass(frozen=True, slots=True)
class TilesDone(Message):
    """Every tile of the job is done: the finalizer's cue. ``completion`` is the newest
    ``lease_fence`` among its tiles when they were seen all done (the event's id)."""

    job_id: str
    completion: int

    def headers(self) -> dict[str, str]:
        """Kind ``tiles-done`` and job id."""
        return {
            n.HDR_KIND: EventKind.TILES_DONE.value,
            n.HDR_JOB: header_value(self.job_id),
        }


@dataclass(frozen=True, slots=True)
class JobEvent(Message):
    """A job-level fact for watchers: completed, failed, cancelled, dead-lettered, retried."""

    job_id: str
    kind: EventKind
    generation: int = 0
    detail: str = ""
    result_key: str | None = None

    def __post_init__(self) -> None:
        if EventKind(self.kind) is EventKind.TILE_DONE:
            raise ValueError("kind tile-done is a TileDone message, not a JobEvent")
        if EventKind(self.kind) is EventKind.TILES_DONE:
            raise ValueError("kind tiles-done is a TilesDone message, not a JobEvent")

    def headers(self) -> dict[str, str]:
        """Kind (the event kind, e.g. ``job-completed``), job id and generation."""
        return {
            n.HDR_KIND: EventKind(self.kind).value,
            n.HDR_JOB: header_value(self.job_id),
            n.HDR_GENERATION: header_value(self.generation),
        }


@dataclass(frozen=True, slots=True)
class DeadLetter(Message):
    """A copy of a message that will never succeed, with the reason (``DLQ``).

    ``unit`` is ``tile-<i>``, ``job`` or ``final``; ``reason`` is an error code (for example
    ``max_deliveries`` or ``invalid``); ``payload`` is the original message, byte for byte, so a
    requeue republishes exactly what failed.
    """

    job_id: str
    unit: str
    reason: str
    error: str
    source_stream: str
    source_seq: int
    deliveries: int
    subject: str
    payload: bytes

    def headers(self) -> dict[str, str]:
        """Kind ``dead-letter``, job, unit (and tile), reason, source and deliveries."""
        found = {
            n.HDR_KIND: n.KIND_DEAD_LETTER,
            n.HDR_JOB: header_value(self.job_id),
            n.HDR_UNIT: header_value(self.unit),
            n.HDR_REASON: header_value(self.reason),
            n.HDR_SOURCE: header_value(f"{self.source_stream}:{self.source_seq}"),
            n.HDR_DELIVERIES: header_value(self.deliveries),
        }
        tile = self.unit.removeprefix("tile-")
        if tile != self.unit and tile.isdigit():
            found[n.HDR_TILE] = tile
        return found


@dataclass(frozen=True, slots=True)
class Room(Message):
    """``tiles`` tiles have left a worker's hand since its last ``Room`` (settled: done,
    failed, handed back): the dispatchers' nudge, sent on core NATS every few tiles instead of
    one tile-done event heard per tile (docs/architecture.md, "Scheduler")."""

    tiles: int

    def __post_init__(self) -> None:
        if self.tiles < 1:
            raise ValueError(f"tiles must be at least 1, got {self.tiles}")

    def headers(self) -> dict[str, str]:
        """Kind ``room``."""
        return {n.HDR_KIND: n.KIND_ROOM}
