"""Leases and progress pointers in memory: revisions monotonic across the bucket, fenced CAS.

What :class:`shared.nats.leases.Leases` and :class:`shared.nats.leases.ProgressPointers` promise,
without a server: one bucket-wide revision counter (so an acquire revision is a fencing token),
create only over nothing, compare-and-set renew and release, a lease that expires when told to
(:meth:`MemoryLeases.expire`, what the server's TTL does to an owner that stopped renewing).
"""

from __future__ import annotations

import dataclasses
import time

from shared.core.errors import LeaseLost
from shared.nats.leases import Lease, LeaseOwner, ProgressPointer, WrongLastSequence


class MemoryBucket:
    """Keys to ``(value, revision)``; the revision counter is the bucket's."""

    def __init__(self) -> None:
        self.revision = 0
        self.keys: dict[str, tuple[object, int]] = {}

    def write(self, key: str, value: object) -> int:
        self.revision += 1
        self.keys[key] = (value, self.revision)
        return self.revision


class MemoryLeases:
    """The :class:`shared.nats.leases.Leases` contract in memory."""

    def __init__(self, ttl: int = 10, bucket: MemoryBucket | None = None) -> None:
        self.ttl = ttl
        self.bucket = bucket or MemoryBucket()

    async def acquire(self, key: str, owner: LeaseOwner) -> Lease | None:
        if key in self.bucket.keys:
            return None
        acquired_at = time.time()
        rev = self.bucket.write(key, (owner, acquired_at))
        return Lease(key, rev, rev, owner, self.ttl, acquired_at)

    def _ours(self, lease: Lease) -> bool:
        # Like the real store: the key still holds this very acquisition (a renew of ours that
        # landed unseen moved the revision, not the value).
        current = self.bucket.keys.get(lease.key)
        return current is not None and current[0] == (lease.owner, lease.acquired_at)

    async def renew(self, lease: Lease) -> Lease:
        if not self._ours(lease):
            raise LeaseLost(f"lease {lease.key}: taken over or expired")
        value = (lease.owner, lease.acquired_at)
        return dataclasses.replace(lease, revision=self.bucket.write(lease.key, value))

    async def release(self, lease: Lease) -> bool:
        if not self._ours(lease):
            return False
        del self.bucket.keys[lease.key]
        return True

    async def holder(self, key: str) -> tuple[LeaseOwner, int] | None:
        current = self.bucket.keys.get(key)
        if current is None:
            return None
        value, rev = current
        assert isinstance(value, tuple) and isinstance(value[0], LeaseOwner)
        return value[0], rev

    def expire(self, key: str) -> None:
        """What the server's TTL does to a lease nobody renewed."""
        self.bucket.keys.pop(key, None)


class MemoryPointers:
    """The :class:`shared.nats.leases.ProgressPointers` contract in memory."""

    def __init__(self, bucket: MemoryBucket | None = None) -> None:
        self.bucket = bucket or MemoryBucket()

    async def get(self, key: str) -> tuple[ProgressPointer, int] | None:
        current = self.bucket.keys.get(key)
        if current is None:
            return None
        pointer, rev = current
        assert isinstance(pointer, ProgressPointer)
        return pointer, rev

    async def put(self, key: str, pointer: ProgressPointer, *, last: int | None) -> int:
        current = self.bucket.keys.get(key)
        if current is not None and current[0] == pointer and last != current[1]:
            return current[1]  # a repeated write of the same pointer (an ambiguous retry)
        if (current[1] if current else None) != last:
            raise WrongLastSequence(f"pointer {key}: expected revision {last}")
        return self.bucket.write(key, pointer)

    async def delete(self, key: str) -> None:
        self.bucket.keys.pop(key, None)
