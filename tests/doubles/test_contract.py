"""One contract for the lease and pointer stores: the in-memory double and real NATS KV."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from shared.core.errors import LeaseLost
from shared.nats.leases import LeaseOwner, ProgressPointer, WrongLastSequence
from tests.doubles.conftest import KV


def _owner(node: str = "node-a") -> LeaseOwner:
    return LeaseOwner(node=node, attempt_id=uuid.uuid4().hex)


def _pointer(attempt: str, samples: int = 8) -> ProgressPointer:
    return ProgressPointer("ab" * 32, samples, f"checkpoints/j/0/{attempt}.npy", attempt)


async def test_one_of_many_acquirers_wins_and_its_token_fences(kv: KV):
    got = await asyncio.gather(*(kv.leases.acquire("tile.j.0", _owner(f"n{i}")) for i in range(8)))
    winners = [g for g in got if g is not None]
    assert len(winners) == 1
    lease = winners[0]
    assert lease.token == lease.revision
    assert await kv.leases.holder("tile.j.0") == (lease.owner, lease.revision)


async def test_renew_advances_the_revision_and_keeps_the_token(kv: KV):
    lease = await kv.leases.acquire("tile.j.1", _owner())
    assert lease is not None
    renewed = await kv.leases.renew(lease)
    assert renewed.token == lease.token and renewed.revision > lease.revision
    assert await kv.leases.release(lease), "a renew of ours that landed unseen is still ours"
    assert await kv.leases.holder("tile.j.1") is None
    assert not await kv.leases.release(renewed), "released: nothing left to release"


async def test_an_expired_lease_goes_to_a_newer_token_and_the_zombie_is_refused(kv: KV):
    old = await kv.leases.acquire("tile.j.2", _owner("zombie"))
    assert old is not None
    await kv.expire("tile.j.2")
    new = await kv.leases.acquire("tile.j.2", _owner("fresh"))
    assert new is not None and new.token > old.token, "revisions are monotonic: a fence"
    with pytest.raises(LeaseLost):
        await kv.leases.renew(old)
    assert not await kv.leases.release(old)
    assert await kv.leases.holder("tile.j.2") == (new.owner, new.revision)


async def test_pointers_are_compare_and_set(kv: KV):
    key = f"progress.j.{uuid.uuid4().hex[:6]}"
    assert await kv.pointers.get(key) is None
    first = await kv.pointers.put(key, _pointer("a"), last=None)
    with pytest.raises(WrongLastSequence):
        await kv.pointers.put(key, _pointer("b"), last=None)
    again = await kv.pointers.put(key, _pointer("a"), last=None)
    assert again == first, "a repeated write of the same pointer is its own answer"
    second = await kv.pointers.put(key, _pointer("a", 16), last=first)
    assert second > first
    with pytest.raises(WrongLastSequence):
        await kv.pointers.put(key, _pointer("b", 16), last=first)
    assert await kv.pointers.get(key) == (_pointer("a", 16), second)
    await kv.pointers.delete(key)
    assert await kv.pointers.get(key) is None
    assert await kv.pointers.put(key, _pointer("c"), last=None) > second, "created again"
