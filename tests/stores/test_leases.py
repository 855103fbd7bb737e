"""Leases and progress pointers against the real NATS server: races, expiry, fencing."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from nats.js import JetStreamContext

from shared.core.errors import LeaseLost, ValidationError
from shared.nats.leases import (
    LeaseOwner,
    Leases,
    ProgressPointer,
    ProgressPointers,
    WrongLastSequence,
    _value_of,
)
from tests.helpers import eventually


def owner(node: str = "node-a") -> LeaseOwner:
    return LeaseOwner(node=node, attempt_id=uuid.uuid4().hex)


def pointer(attempt_id: str, samples: int = 8) -> ProgressPointer:
    return ProgressPointer(
        input_hash="ab" * 32,
        samples_done=samples,
        checkpoint_key=f"checkpoints/job/0/{attempt_id}.npy",
        attempt_id=attempt_id,
    )


async def test_exactly_one_of_50_concurrent_acquirers_wins(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=10)
    contenders = [owner(f"node-{i}") for i in range(50)]
    got = await asyncio.gather(*(leases.acquire("tile.job1.0", o) for o in contenders))
    winners = [lease for lease in got if lease is not None]
    assert len(winners) == 1
    held = await leases.holder("tile.job1.0")
    assert held == (winners[0].owner, winners[0].token)


async def test_value_is_operator_readable_json(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=10)
    me = owner()
    lease = await leases.acquire("final.job1", me)
    assert lease is not None
    entry = await (await js.key_value(lease_bucket)).get("final.job1")
    assert entry.value is not None
    doc = json.loads(entry.value)
    assert doc["node"] == me.node and doc["attempt_id"] == me.attempt_id
    assert doc["acquired_at"] == pytest.approx(lease.acquired_at)


async def test_expired_lease_fences_the_zombie(
    js: JetStreamContext, lease_bucket: str, progress_bucket: str
):
    leases = Leases(js, lease_bucket, ttl=1)
    pointers = ProgressPointers(js, progress_bucket)
    zombie_owner, new_owner = owner("zombie"), owner("fresh")
    zombie = await leases.acquire("tile.job1.3", zombie_owner)
    assert zombie is not None
    zombie_rev = await pointers.put("tile.job1.3", pointer(zombie_owner.attempt_id), last=None)

    # The zombie stops renewing; the server's clock expires the key.
    await eventually(
        lambda: _is_free(leases, "tile.job1.3"),
        timeout=5,
        what="lease expiry",
    )
    fresh = await leases.acquire("tile.job1.3", new_owner)
    assert fresh is not None
    assert fresh.token > zombie.token
    found = await pointers.get("tile.job1.3")
    assert found is not None and found[1] == zombie_rev
    fresh_rev = await pointers.put("tile.job1.3", pointer(new_owner.attempt_id, 0), last=found[1])

    with pytest.raises(LeaseLost):
        await leases.renew(zombie)
    assert await leases.release(zombie) is False
    with pytest.raises(WrongLastSequence):
        await pointers.put("tile.job1.3", pointer(zombie_owner.attempt_id, 16), last=zombie_rev)
    assert await leases.holder("tile.job1.3") == (new_owner, fresh.token)
    current = await pointers.get("tile.job1.3")
    assert current == (pointer(new_owner.attempt_id, 0), fresh_rev)


async def _is_free(leases: Leases, key: str) -> bool:
    return await leases.holder(key) is None


async def test_renew_keeps_the_lease_past_several_ttls(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=1)
    lease = await leases.acquire("tile.job2.0", owner())
    assert lease is not None
    token, revision = lease.token, lease.revision
    loop = asyncio.get_running_loop()
    until = loop.time() + 3.2
    while loop.time() < until:
        await asyncio.sleep(0.3)
        lease = await leases.renew(lease)
        assert await leases.acquire("tile.job2.0", owner("rival")) is None
    assert lease.token == token and lease.revision > revision
    assert await leases.holder("tile.job2.0") == (lease.owner, lease.revision)
    assert await leases.release(lease) is True


async def test_release_frees_the_lease_at_once(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=30)
    first = await leases.acquire("tile.job3.1", owner("a"))
    assert first is not None
    assert await leases.acquire("tile.job3.1", owner("b")) is None
    assert await leases.release(first) is True
    assert await leases.holder("tile.job3.1") is None
    second = await leases.acquire("tile.job3.1", owner("b"))
    assert second is not None and second.token > first.token
    assert await leases.release(first) is False  # twice: not ours any more, no exception
    with pytest.raises(LeaseLost):
        await leases.renew(first)
    assert await leases.holder("tile.job3.1") == (second.owner, second.token)


async def test_released_key_leaves_no_marker_behind(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=1)
    lease = await leases.acquire("tile.job4.0", owner())
    assert lease is not None and await leases.release(lease)
    stream = f"KV_{lease_bucket}"

    async def empty() -> bool:
        return (await js.stream_info(stream)).state.messages == 0

    await eventually(empty, timeout=5, what="delete marker expiry")


async def test_held_names_the_live_leases_among_many_keys(js: JetStreamContext, lease_bucket: str):
    leases, short = Leases(js, lease_bucket, ttl=30), Leases(js, lease_bucket, ttl=1)
    live = await leases.acquire("tile.job5.1", owner())
    released = await leases.acquire("tile.job5.2", owner())
    expiring = await short.acquire("tile.job5.3", owner())
    other_job = await leases.acquire("tile.job6.1", owner())
    assert live and released and expiring and other_job
    assert await leases.release(released)  # a delete marker stays for a TTL
    keys = [f"tile.job5.{i}" for i in range(200)]
    assert await leases.held(keys, scan="tile.job5.*") == {"tile.job5.1", "tile.job5.3"}

    async def expired() -> bool:
        return await leases.holder("tile.job5.3") is None

    await eventually(expired, timeout=5, what="lease expiry")
    assert await leases.held(keys, scan="tile.job5.*") == {"tile.job5.1"}
    assert await leases.held(["tile.job6.1", "tile.job6.2"], scan="tile.job6.*") == {"tile.job6.1"}
    with pytest.raises(ValidationError):
        await leases.held(keys, scan="tile.job5.>.x")


async def test_twenty_concurrent_pointer_takeovers_have_one_winner(
    js: JetStreamContext, progress_bucket: str
):
    pointers = ProgressPointers(js, progress_bucket)
    base = await pointers.put("tile.job5.2", pointer("first"), last=None)

    async def take_over(i: int) -> int | None:
        try:
            return await pointers.put("tile.job5.2", pointer(f"taker-{i}", i), last=base)
        except WrongLastSequence:
            return None

    results = await asyncio.gather(*(take_over(i) for i in range(20)))
    won = [r for r in results if r is not None]
    assert len(won) == 1
    current = await pointers.get("tile.job5.2")
    assert current is not None and current[1] == won[0]


async def test_pointer_create_delete_and_recreate(js: JetStreamContext, progress_bucket: str):
    pointers = ProgressPointers(js, progress_bucket)
    assert await pointers.get("tile.job6.0") is None
    rev = await pointers.put("tile.job6.0", pointer("a"), last=None)
    with pytest.raises(WrongLastSequence):
        await pointers.put("tile.job6.0", pointer("b"), last=None)
    await pointers.delete("tile.job6.0")
    await pointers.delete("tile.job6.0")  # idempotent
    assert await pointers.get("tile.job6.0") is None
    again = await pointers.put("tile.job6.0", pointer("c"), last=None)  # over the marker
    assert again > rev
    assert await pointers.get("tile.job6.0") == (pointer("c"), again)


async def test_bad_keys_and_ttls_are_refused(js: JetStreamContext, lease_bucket: str):
    with pytest.raises(ValidationError):
        Leases(js, lease_bucket, ttl=0)
    leases = Leases(js, lease_bucket, ttl=5)
    for key in ("", "tile..x", "tile.*", "a b", ".x"):
        with pytest.raises(ValidationError):
            await leases.acquire(key, owner())


async def test_renew_whose_answer_was_lost_still_holds(js: JetStreamContext, lease_bucket: str):
    leases = Leases(js, lease_bucket, ttl=10)
    lease = await leases.acquire("tile.job7.0", owner())
    assert lease is not None
    # A renew that landed but whose PubAck never arrived: the next renew, still based on the
    # old revision, is refused by the server; re-reading shows the key is still ours.
    landed = await leases._kv.write(lease.key, _value_of(lease), last=lease.revision, ttl=lease.ttl)
    renewed = await leases.renew(lease)
    assert renewed.token == lease.token and renewed.revision == landed
    assert await leases.release(lease) is True  # stale revision, but the key is ours: freed
    assert await leases.holder("tile.job7.0") is None


async def test_repeated_pointer_write_is_idempotent(js: JetStreamContext, progress_bucket: str):
    pointers = ProgressPointers(js, progress_bucket)
    base = await pointers.put("tile.job8.0", pointer("a", 4), last=None)
    first = await pointers.put("tile.job8.0", pointer("a", 8), last=base)
    assert await pointers.put("tile.job8.0", pointer("a", 8), last=base) == first
    with pytest.raises(WrongLastSequence):
        await pointers.put("tile.job8.0", pointer("a", 12), last=base)
