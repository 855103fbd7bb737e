"""The object store interface, its errors, and key/checksum validation shared by the adapters.

Errors (beyond :mod:`shared.core.errors`)::

    RetryableError
    ├── StoreUnavailable      the store did not answer (connection, timeout, 5xx, SlowDown, EIO)
    └── CorruptObject         the bytes read back do not match their sha256
    TerminalError
    ├── NotFoundError         no object under that key
    ├── StoreAccessDenied     bad credentials or no permission: fix the configuration
    └── StoreRejected         the store refused the request for another reason
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from shared.core.errors import NotFoundError, RetryableError, TerminalError, ValidationError

T = TypeVar("T")
MAX_KEY = 512
_PART = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}"
KEY_RE = re.compile(rf"{_PART}(/{_PART})*")
"""A store key: ``/``-separated parts that never start with a dot (no ``..``, no hidden files)."""
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class CorruptObject(RetryableError):
    """The object's bytes do not match the expected sha256 (torn, truncated or overwritten).

    Retrying the *read* will not help; redoing the work that wrote it will: discard the
    checkpoint or re-render the tile. The object is left in place for inspection.
    """

    code = "corrupt_object"


class StoreAccessDenied(TerminalError):
    """The object store refused our credentials or permissions; fix the configuration."""

    code = "store_access_denied"


class StoreRejected(TerminalError):
    """The object store refused a request for a reason retrying cannot fix."""

    code = "store_rejected"


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key, size in bytes and last modification (unix time)."""

    key: str
    size: int
    modified: float


def sha256_hex(data: bytes) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid store key, else raise :class:`ValidationError`."""
    if not isinstance(key, str) or len(key) > MAX_KEY or KEY_RE.fullmatch(key) is None:
        raise ValidationError(f"object key {key!r} is not /-separated parts of [A-Za-z0-9_.-]")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or the beginning of a valid key (``a/b/``, ``a/b``)."""
    if prefix == "":
        return prefix
    head, _, last = prefix.rpartition("/")
    if (head and KEY_RE.fullmatch(head) is None) or (last and KEY_RE.fullmatch(last) is None):
        raise ValidationError(f"object key prefix {prefix!r} is not the start of a valid key")
    if prefix.startswith("/"):
        raise ValidationError(f"object key prefix {prefix!r} must be relative")
    return prefix


def check_sha256(value: str, what: str = "sha256") -> str:
    """Return ``value`` if it is a lowercase hex sha256 digest, else raise."""
    if not isinstance(value, str) or SHA256_RE.fullmatch(value) is None:
        raise ValidationError(f"{what}: {value!r} is not a lowercase hex sha256 digest")
    return value


def verify(key: str, data: bytes, expected: str | None) -> bytes:
    """Return ``data`` if its sha256 is ``expected`` (or nothing is expected)."""
    if expected is not None:
        actual = sha256_hex(data)
        if actual != check_sha256(expected):
            raise CorruptObject(
                f"object {key}: sha256 {actual} ({len(data)} bytes) != expected {expected}"
            )
    return data


async def gather_all(*aws: Awaitable[T]) -> builtins.list[T | BaseException]:
    """Every awaitable's result or exception, once all have ended (none left running when the
    caller raises the first error)."""
    return list(await asyncio.gather(*aws, return_exceptions=True))


def settled(results: Iterable[T | BaseException]) -> builtins.list[T]:
    """``results`` of :func:`gather_all`, or the first exception among them raised."""
    out: builtins.list[T] = []
    for result in results:
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    return out


def check_in_flight(in_flight: int) -> None:
    if in_flight < 1:  # (a semaphore of 0 would never let a request through)
        raise ValueError(f"in_flight={in_flight} must be >= 1")


class ObjectStore(ABC):
    """Whole-object storage: every ``put`` is atomic, every key is built by :mod:`.keys`.

    Use as ``async with await open_object_store(settings) as store:`` or call :meth:`close`.
    """

    #: reads cross a network (S3): worth starting early. The directory store's are local
    #: page-cache reads, about 10 us for a 64x64 tile's result (the finalizer's read-ahead)
    remote: bool = False

    @abstractmethod
    async def put(
        self, key: str, data: bytes, *, durable: bool = True, sha256: str | None = None
    ) -> str:
        """Store ``data`` under ``key`` atomically (replacing any object); return its sha256.

        A reader sees the old object or the new one, never a part of either. ``durable=False``
        lets a store skip making the object survive an operating-system crash once ``put``
        returns (the directory store's fsyncs; S3 is durable either way): only for an object
        whose loss is detected by its recorded sha256 and made again (a tile result, rendered
        again by the finalizer's "result lost" path). ``sha256``: the digest of ``data`` the
        caller computed already (a content-addressed key is built from it), used as is rather
        than hashing the bytes a second time (a tile result, a final image, an asset chunk).
        """

    @abstractmethod
    async def get(self, key: str, *, sha256: str | None = None) -> bytes:
        """The whole object. :class:`NotFoundError` if absent; :class:`CorruptObject` if
        ``sha256`` is given (or was recorded at ``put``) and the bytes do not match."""

    async def get_many(
        self, items: Sequence[tuple[str, str | None]], *, in_flight: int = 16
    ) -> builtins.list[bytes | NotFoundError | CorruptObject]:
        """Each ``(key, sha256)`` as :meth:`get` reads it, in order: its bytes, or the
        :class:`NotFoundError` or :class:`CorruptObject` that :meth:`get` raises for it (any
        other error raises: the store is unavailable). At most ``in_flight`` requests at a
        time (a store may read several objects in one request).
        """
        check_in_flight(in_flight)
        for key, _ in items:
            check_key(key)  # (a bad key refuses the call before any request starts)
        gate = asyncio.Semaphore(in_flight)

        async def one(key: str, sha256: str | None) -> bytes | NotFoundError | CorruptObject:
            async with gate:
                try:
                    return await self.get(key, sha256=sha256)
                except (NotFoundError, CorruptObject) as exc:
                    return exc

        answers: builtins.list[bytes | NotFoundError | CorruptObject] = []
        for got in await gather_all(*(one(key, sha) for key, sha in items)):
            if isinstance(got, bytes | NotFoundError | CorruptObject):
                answers.append(got)
            else:  # raised: the store is unavailable (or a bug)
                raise got
        return answers

    async def put_many(
        self, items: Sequence[tuple[str, bytes, str]], *, durable: bool = True, in_flight: int = 16
    ) -> None:
        """Store each ``(key, data, sha256)`` as :meth:`put` stores it (``sha256``: the digest
        of ``data`` its caller computed), at most ``in_flight`` requests at a time (a store may
        write several objects in one request or thread call). Nothing is being written when this
        returns or raises; the first error is raised, and which of the other objects were
        written is then not said (a store may stop at its first failure)."""
        check_in_flight(in_flight)
        for key, _, _ in items:
            check_key(key)  # (a bad key refuses the call before any write starts)
        gate = asyncio.Semaphore(in_flight)

        async def one(key: str, data: bytes, sha256: str) -> str:
            async with gate:
                return await self.put(key, data, durable=durable, sha256=sha256)

        settled(await gather_all(*(one(*item) for item in items)))

    @abstractmethod
    async def size(self, key: str) -> int:
        """Bytes of the object; :class:`NotFoundError` if absent."""

    @abstractmethod
    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end; none past it).

        Not verified: a caller checks the whole object's sha256 once it has every range.
        """

    async def presign_get(self, key: str, expires: int) -> str | None:
        """An HTTP GET URL for the object valid ``expires`` seconds, or None if this store
        cannot sign one (the directory store). Signing checks nothing; call :meth:`size` first."""
        return None

    @abstractmethod
    async def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the object; a missing object is not an error."""

    @abstractmethod
    async def list(self, prefix: str, *, limit: int | None = None) -> builtins.list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, sorted by key, at most ``limit`` of them."""

    @abstractmethod
    async def ping(self) -> None:
        """Readiness: return if the store answers, raise :class:`StoreUnavailable` if not."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections (idempotent)."""

    async def __aenter__(self) -> ObjectStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
