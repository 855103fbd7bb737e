"""KV leases (expiring, fenced ownership) and progress pointers, over JetStream KV buckets.

Both buckets are plain JetStream streams (``KV_<bucket>``, one message per key, see
:mod:`proto.topology`), so every operation here is a publish with
``Nats-Expected-Last-Subject-Sequence`` (compare-and-set) or a leader read, retried within a
bound by :mod:`shared.nats.jetstream`:

- **acquire** writes the key expecting "no message" (or over a delete marker), with a per-key
  TTL (``Nats-TTL``): the server's clock expires an abandoned lease. The revision of that write
  is the **fencing token**; revisions are stream sequences, monotonic across the whole bucket,
  so a later owner always holds a larger token.
- **renew** re-writes the same value over our last revision with a fresh TTL.
- **release** writes a delete marker over our last revision; the marker itself carries the TTL,
  so released keys leave nothing behind.

A write whose answer was lost (timeout, leader election) and was retried fails with "wrong last
sequence" if the first try landed: every such refusal is followed by a re-read, and a key whose
current value is ours counts as success. Values are JSON so an operator can read them with
``nats kv get``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from shared.core.errors import DecodeError, LeaseLost, StoreUnavailable, ValidationError
from shared.nats.jetstream import (
    WrongLastSequence,
    publish,
    retry_transient,
    subjects_with_messages,
    translate_api_error,
)

__all__ = [
    "Lease",
    "LeaseOwner",
    "Leases",
    "ProgressPointer",
    "ProgressPointers",
    "WrongLastSequence",
]

_KEY_RE = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")
ERR_NO_MESSAGE = 10037
ERR_STREAM_NOT_FOUND = 10059
_HDR_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_HDR_OP = "KV-Operation"
POINTER_MARKER_TTL = 60
"""Seconds a progress delete marker stays visible (``nats kv history``) before it vanishes."""
_CREATE_ROUNDS = 4
"""Create attempts when the key keeps changing under us (expiry, delete markers)."""
_READ_CONCURRENCY = 64
"""Key reads in flight at once in :meth:`Leases.held`."""


@dataclass(frozen=True)
class _Raw:
    """The last message of a key: a value, or a delete/purge marker."""

    revision: int
    value: bytes
    deleted: bool


class _Bucket:
    """Raw reads and conditional writes on one KV bucket's backing stream."""

    def __init__(self, js: JetStreamContext, bucket: str, op_timeout: float) -> None:
        self.js = js
        self.name = bucket
        self.stream = f"KV_{bucket}"
        self.op_timeout = op_timeout

    def subject(self, key: str) -> str:
        if _KEY_RE.fullmatch(key) is None:
            raise ValidationError(f"KV key {key!r} is not dot-separated [-/_=a-zA-Z0-9] tokens")
        return f"$KV.{self.name}.{key}"

    def filter_subject(self, pattern: str) -> str:
        """The subject filter of a key wildcard (tokens may be ``*``, the last one ``>``)."""
        tokens = pattern.split(".")
        ok = all(t == "*" or _KEY_RE.fullmatch(t) for t in tokens[:-1]) and (
            tokens[-1] in ("*", ">") or _KEY_RE.fullmatch(tokens[-1]) is not None
        )
        if not ok:
            raise ValidationError(f"KV key pattern {pattern!r} is not a key wildcard")
        return f"$KV.{self.name}.{pattern}"

    async def read(self, key: str, *, timeout_total: float | None = None) -> _Raw | None:
        """The key's last message from the stream leader, or ``None`` if it has none."""
        subject = self.subject(key)

        async def attempt(budget: float) -> Any:
            return await asyncio.wait_for(self.js.get_msg(self.stream, subject=subject), budget)

        what = f"read {self.name}/{key}"
        try:
            msg = await retry_transient(
                what, attempt, timeout_total=timeout_total or self.op_timeout
            )
        except NotFoundError as exc:
            if exc.err_code == ERR_STREAM_NOT_FOUND:
                raise StoreUnavailable(
                    f"{what}: bucket stream {self.stream} does not exist"
                ) from exc
            return None
        except APIError as exc:
            raise translate_api_error(what, exc) from exc
        headers = msg.headers or {}
        deleted = headers.get(_HDR_OP) in ("DEL", "PURGE")
        return _Raw(revision=int(msg.seq), value=bytes(msg.data or b""), deleted=deleted)

    async def write(
        self,
        key: str,
        value: bytes,
        *,
        last: int | None,
        ttl: int | None,
        delete: bool = False,
        timeout_total: float | None = None,
    ) -> int:
        """Write ``value`` (or a delete marker) if the key's last revision is ``last``.

        ``last=0`` means "the key has no message"; ``None`` writes unconditionally. Raises
        :class:`WrongLastSequence` if it does not match, :class:`StoreUnavailable` on no answer.
        """
        headers = {} if last is None else {_HDR_EXPECTED: str(last)}
        if delete:
            headers[_HDR_OP] = "DEL"
        ack = await publish(
            self.js,
            self.subject(key),
            value,
            msg_id=None,  # CAS is the guard; dedup would hide a wrong-sequence refusal anyway
            headers=headers,
            msg_ttl=ttl,
            timeout_total=timeout_total or self.op_timeout,
        )
        return int(ack.seq)


# ---------------------------------------------------------------------------------- leases


@dataclass(frozen=True)
class LeaseOwner:
    """Who holds a lease: the worker process and the attempt (one execution of one unit)."""

    node: str
    attempt_id: str


@dataclass(frozen=True)
class Lease:
    """A held lease.

    ``token`` is the acquire revision, the fencing token carried into every commit; it never
    changes. ``revision`` is our latest write (acquire or renew), the CAS base of the next one.
    """

    key: str
    token: int
    revision: int
    owner: LeaseOwner
    ttl: int
    #: unix time of the acquire, kept in the value across renews (for operators)
    acquired_at: float = 0.0


def _encode_owner(owner: LeaseOwner, acquired_at: float) -> bytes:
    doc = {"node": owner.node, "attempt_id": owner.attempt_id, "acquired_at": acquired_at}
    return orjson.dumps(doc)


def _value_of(lease: Lease) -> bytes:
    """The exact bytes of this acquisition: two acquisitions never share them."""
    return _encode_owner(lease.owner, lease.acquired_at)


def _decode_owner(key: str, raw: bytes) -> LeaseOwner:
    try:
        doc = orjson.loads(raw)
        node, attempt_id = doc["node"], doc["attempt_id"]
    except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
        raise DecodeError(f"lease {key}: value {raw[:80]!r} is not a lease document") from exc
    if not isinstance(node, str) or not isinstance(attempt_id, str):
        raise DecodeError(f"lease {key}: node and attempt_id must be strings")
    return LeaseOwner(node=node, attempt_id=attempt_id)


class Leases:
    """Expiring, fenced leases in one KV bucket (``Names(...).bucket(BUCKET_LEASES)``).

    ``ttl`` is the lease lifetime without a renew, whole seconds >= 1 (the server's per-key TTL
    granularity). ``op_timeout`` bounds acquire and release retries; a renew is bounded by the
    TTL itself, since after that the lease is gone anyway.
    """

    def __init__(
        self, js: JetStreamContext, bucket: str, ttl: int, *, op_timeout: float = 10.0
    ) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValidationError(f"lease ttl={ttl!r} must be whole seconds >= 1")
        self._kv = _Bucket(js, bucket, op_timeout)
        self.ttl = ttl

    async def acquire(self, key: str, owner: LeaseOwner) -> Lease | None:
        """Take the lease if nobody holds it; ``None`` if someone (anyone, us included) does.

        Exactly one of any number of concurrent contenders wins. Raises
        :class:`StoreUnavailable` if JetStream does not answer within the bound.
        """
        acquired_at = time.time()
        value = _encode_owner(owner, acquired_at)
        last = 0
        for _ in range(_CREATE_ROUNDS):
            try:
                rev = await self._kv.write(key, value, last=last, ttl=self.ttl)
                return Lease(key, rev, rev, owner, self.ttl, acquired_at)
            except WrongLastSequence:
                current = await self._kv.read(key)
            if current is not None and current.value == value and not current.deleted:
                # An earlier try of this very call landed; its answer was lost.
                rev = current.revision
                return Lease(key, rev, rev, owner, self.ttl, acquired_at)
            if current is not None and not current.deleted:
                return None
            last = 0 if current is None else current.revision  # expired, or over a marker
        return None  # the key kept changing: someone else is busy with it

    async def renew(self, lease: Lease) -> Lease:
        """Extend the lease by a full TTL (compare-and-set over our last revision).

        Raises :class:`LeaseLost` if the key is no longer ours, or if no renew could be
        confirmed within the TTL (the server may have expired it): stop work, commit nothing.
        """
        value = _value_of(lease)
        try:
            rev = await self._kv.write(
                lease.key, value, last=lease.revision, ttl=lease.ttl, timeout_total=lease.ttl
            )
        except StoreUnavailable as exc:
            raise LeaseLost(f"lease {lease.key}: renew not confirmed within the TTL") from exc
        except WrongLastSequence:
            rev = await self._still_ours(lease)
        return replace(lease, revision=rev)

    async def _still_ours(self, lease: Lease) -> int:
        """After a refused renew: our revision if the key still carries our owner, else raise."""
        try:
            current = await self._kv.read(lease.key, timeout_total=lease.ttl / 2)
        except StoreUnavailable as exc:
            raise LeaseLost(f"lease {lease.key}: renew refused and key unreadable") from exc
        if current is not None and not current.deleted and current.value == _value_of(lease):
            return current.revision  # our own ambiguous renew landed
        raise LeaseLost(f"lease {lease.key}: taken over or expired (was revision {lease.revision})")

    async def release(self, lease: Lease) -> bool:
        """Give the lease up; ``False`` if it was no longer ours (expired or taken over).

        Never raises for "not ours"; raises :class:`StoreUnavailable` if JetStream does not
        answer (the lease then simply expires after its TTL).
        """
        last = lease.revision
        for _ in range(_CREATE_ROUNDS):
            try:
                await self._kv.write(lease.key, b"", last=last, ttl=lease.ttl, delete=True)
                return True
            except WrongLastSequence:
                current = await self._kv.read(lease.key)
            if current is None or current.deleted or current.value != _value_of(lease):
                return False
            last = current.revision  # a renew of ours landed after we last looked
        return False

    async def holder(self, key: str) -> tuple[LeaseOwner, int] | None:
        """The current owner and latest revision, or ``None`` if the lease is free."""
        current = await self._kv.read(key)
        if current is None or current.deleted:
            return None
        return _decode_owner(key, current.value), current.revision

    async def held(self, keys: Collection[str], *, scan: str) -> set[str]:
        """Which of ``keys`` have a live lease, in a few requests rather than one per key.

        ``scan`` is a key wildcard covering ``keys`` (``tile.<job>.*``). One listing of the
        bucket's subjects under it names the keys that have a message at all; a key with none
        is free without being read. A listed key is read (concurrently) to tell a live lease
        from the delete marker a release leaves for a TTL. If the listing is incomplete, every
        key is read.
        """
        wanted = set(keys)
        listed = await subjects_with_messages(
            self._kv.js,
            self._kv.stream,
            self._kv.filter_subject(scan),
            timeout_total=self._kv.op_timeout,
        )
        if listed is not None:
            wanted = {k for k in wanted if self._kv.subject(k) in listed}
        gate = asyncio.Semaphore(_READ_CONCURRENCY)

        async def live(key: str) -> bool:
            async with gate:
                current = await self._kv.read(key)
            return current is not None and not current.deleted

        ordered = sorted(wanted)
        found = await asyncio.gather(*(live(k) for k in ordered))
        return {k for k, is_live in zip(ordered, found, strict=True) if is_live}


# ------------------------------------------------------------------------ progress pointers


@dataclass(frozen=True)
class ProgressPointer:
    """Where a tile's last checkpoint is: resume only if ``input_hash`` still matches."""

    input_hash: str
    samples_done: int
    checkpoint_key: str
    attempt_id: str

    def encode(self) -> bytes:
        """The JSON value stored in the progress bucket."""
        return orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def decode(cls, key: str, raw: bytes) -> ProgressPointer:
        """Parse a stored value; garbage raises :class:`DecodeError`."""
        try:
            doc = orjson.loads(raw)
            pointer = cls(
                input_hash=doc["input_hash"],
                samples_done=doc["samples_done"],
                checkpoint_key=doc["checkpoint_key"],
                attempt_id=doc["attempt_id"],
            )
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise DecodeError(f"progress {key}: {raw[:80]!r} is not a pointer") from exc
        strings = (pointer.input_hash, pointer.checkpoint_key, pointer.attempt_id)
        samples = pointer.samples_done
        if not all(isinstance(s, str) for s in strings) or type(samples) is not int:
            raise DecodeError(f"progress {key}: field of the wrong type in {raw[:80]!r}")
        return pointer


class ProgressPointers:
    """Compare-and-set progress pointers in one KV bucket (``BUCKET_PROGRESS``)."""

    def __init__(self, js: JetStreamContext, bucket: str, *, op_timeout: float = 10.0) -> None:
        self._kv = _Bucket(js, bucket, op_timeout)

    async def get(self, key: str) -> tuple[ProgressPointer, int] | None:
        """The pointer and its revision, or ``None`` if there is none."""
        current = await self._kv.read(key)
        if current is None or current.deleted:
            return None
        return ProgressPointer.decode(key, current.value), current.revision

    async def put(self, key: str, pointer: ProgressPointer, *, last: int | None) -> int:
        """Write ``pointer`` if the key is still at revision ``last`` (``None``: has none).

        Returns the new revision. Raises :class:`WrongLastSequence` (a ``ConflictError``) if
        someone else wrote since: re-read and decide, never overwrite blindly.
        """
        value = pointer.encode()
        base = 0 if last is None else last
        for _ in range(_CREATE_ROUNDS):
            try:
                return await self._kv.write(key, value, last=base, ttl=None)
            except WrongLastSequence as exc:
                refused = exc
                current = await self._kv.read(key)
            if current is not None and not current.deleted and current.value == value:
                return current.revision  # our ambiguous first try landed
            if last is not None or (current is not None and not current.deleted):
                raise refused
            base = 0 if current is None else current.revision  # create over a delete marker
        raise refused

    async def delete(self, key: str) -> None:
        """Remove the pointer (idempotent); the delete marker itself expires after a while."""
        await self._kv.write(key, b"", last=None, ttl=POINTER_MARKER_TTL, delete=True)
