"""ensure_topology against a real nats-server: idempotent, race-safe, updates, TTL leases."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import uuid

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import KeyWrongLastSequenceError

from proto import names as n
from proto.topology import Topology
from shared.core.errors import ConfigError
from shared.nats.ensure import ensure_topology
from tests.helpers import eventually


def fresh(**params: object) -> Topology:
    """A topology no other test shares (the shared ``namespace`` fixture works too)."""
    return Topology(prefix=f"t{uuid.uuid4().hex[:12]}", **params)  # type: ignore[arg-type]


async def stream_names(js: JetStreamContext) -> set[str]:
    """Every stream on the server: the list API answers a page at a time (256 streams), and a
    session's tests create many more than that."""
    names: set[str] = set()
    offset = 0
    while page := await js.streams_info(offset=offset):
        names |= {i.config.name for i in page if i.config.name}
        offset += len(page)
    return names


async def assert_topology(js: JetStreamContext, topo: Topology) -> None:
    expected = {s.name for s in topo.streams() if s.name}
    present = await stream_names(js)
    if topo.prefix:  # nothing else carries our prefix
        mine = {x for x in present if x.startswith((f"{topo.prefix}_", f"KV_{topo.prefix}_"))}
        assert mine == expected
    else:
        assert expected <= present
    wq = {topo.names.stream(n.STREAM_JOBS), topo.names.stream(n.STREAM_TILES)}
    for stream in topo.streams():
        assert stream.name is not None
        cfg = (await js.stream_info(stream.name)).config
        assert cfg.subjects == stream.subjects
        assert cfg.num_replicas == topo.replicas
        want = api.RetentionPolicy.WORK_QUEUE if stream.name in wq else api.RetentionPolicy.LIMITS
        assert cfg.retention == want
        assert not cfg.subject_delete_marker_ttl
        assert cfg.description and cfg.description == stream.description
    declared: dict[str, set[str]] = {}
    for stream_name, consumer in topo.consumers():
        declared.setdefault(stream_name, set()).add(str(consumer.name))
    for stream_name, consumer in topo.consumers():
        infos = await js._jsm.consumers_info(stream_name)
        assert {c.name for c in infos} == declared[stream_name]
        (ccfg,) = [c.config for c in infos if c.name == consumer.name]
        assert ccfg.durable_name == consumer.name
        assert ccfg.ack_policy == api.AckPolicy.EXPLICIT
        assert ccfg.ack_wait == pytest.approx(topo.ack_wait)
        assert ccfg.max_deliver == topo.max_deliver
        assert ccfg.max_ack_pending == topo.max_ack_pending
        assert not ccfg.backoff
        assert not ccfg.inactive_threshold
        assert ccfg.deliver_subject is None
        assert ccfg.filter_subject == consumer.filter_subject
        assert ccfg.description and ccfg.description == consumer.description
    leases = (await js.stream_info(f"KV_{topo.names.bucket(n.BUCKET_LEASES)}")).config
    assert leases.allow_msg_ttl is True
    assert leases.max_msgs_per_subject == 1


async def test_parallel_on_one_connection(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    await asyncio.gather(ensure_topology(js, topo), ensure_topology(js, topo))
    await assert_topology(js, topo)
    finalizer = await js.consumer_info(topo.names.stream(n.STREAM_EVENTS), n.CONSUMER_FINALIZER)
    assert finalizer.config.filter_subject == topo.names.tiles_done_filter


async def test_parallel_from_four_connections(nats_url: str, nc: Client) -> None:
    topo = fresh(ack_wait=7.0, max_deliver=3, max_ack_pending=16)
    clients = [await nats.connect(nats_url) for _ in range(4)]
    try:
        await asyncio.gather(*(ensure_topology(c.jetstream(), topo) for c in clients))
    finally:
        for c in clients:
            await c.close()
    await assert_topology(nc.jetstream(), topo)


async def test_changed_ack_wait_updates_consumers(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh(ack_wait=30.0)
    await ensure_topology(js, topo)
    changed = Topology(prefix=topo.prefix, ack_wait=12.0, max_deliver=9)
    await ensure_topology(js, changed)
    await assert_topology(js, changed)


async def test_changed_duplicate_window_updates_streams(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    await ensure_topology(js, topo)
    await ensure_topology(js, Topology(prefix=topo.prefix, duplicate_window=30.0))
    info = await js.stream_info(topo.names.stream(n.STREAM_TILES))
    assert info.config.duplicate_window == pytest.approx(30.0)


class Undescribed(Topology):
    """The topology as declared before streams, consumers and buckets had descriptions."""

    def streams(self) -> list[api.StreamConfig]:
        return [dataclasses.replace(s, description=None) for s in super().streams()]

    def consumers(self) -> list[tuple[str, api.ConsumerConfig]]:
        return [(s, dataclasses.replace(c, description=None)) for s, c in super().consumers()]


async def descriptions(js: JetStreamContext, topo: Topology) -> list[str | None]:
    found = [(await js.stream_info(s.name or "")).config.description for s in topo.streams()]
    for stream, consumer in topo.consumers():
        found.append((await js.consumer_info(stream, consumer.name or "")).config.description)
    return found


async def test_every_stream_consumer_and_bucket_is_described(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    await ensure_topology(js, topo)
    found = await descriptions(js, topo)
    assert len(found) == 14  # 5 streams, 3 buckets, 6 consumers (3 of them on TILES)
    assert all(d and len(d) > 40 for d in found), found
    kv = await js.key_value(topo.names.bucket(n.BUCKET_LEASES))  # what `nats kv ls` shows
    assert "lease" in ((await kv.status()).stream_info.config.description or "")


async def test_ensure_describes_an_existing_undescribed_topology(nc: Client) -> None:
    """A deployment made before descriptions gets them at the next start-up, with its messages
    and consumer positions intact; an older service starting afterwards does not remove them."""
    js, topo = nc.jetstream(), fresh()
    old = Undescribed(prefix=topo.prefix)
    await ensure_topology(js, old)
    assert await descriptions(js, old) == [None] * 14
    tiles = topo.names.stream(n.STREAM_TILES)
    await js.publish(topo.names.tile_subject("j1", 0), b"x")
    await ensure_topology(js, topo)
    await assert_topology(js, topo)
    assert (await js.stream_info(tiles)).state.messages == 1
    assert (await js.consumer_info(tiles, n.CONSUMER_WORKERS)).num_pending == 1
    await ensure_topology(js, old)  # an old service in a rolling upgrade: leaves them be
    assert await descriptions(js, old) == await descriptions(js, topo)
    assert all(await descriptions(js, topo))


class BeforeRenderers(Topology):
    """The topology as declared before renderers: one unfiltered ``workers`` on TILES."""

    def consumers(self) -> list[tuple[str, api.ConsumerConfig]]:
        tiles = self.names.stream(n.STREAM_TILES)
        kept = [(s, c) for s, c in super().consumers() if s != tiles]
        old = self._consumer(n.CONSUMER_WORKERS, None)
        return [*kept, (tiles, old)]


async def test_a_deployment_from_before_renderers_migrates(nc: Client) -> None:
    """The old unfiltered ``workers`` consumer becomes tessera's (filtered; its position and
    pending tessera tiles kept), the other renderers' consumers are added beside it (a work
    queue refuses overlapping filters, so this fails if ``workers`` stayed unfiltered), and
    tile messages of the old subject form, which nothing reads any more, are purged."""
    js, topo = nc.jetstream(), fresh()
    tiles = topo.names.stream(n.STREAM_TILES)
    await ensure_topology(js, BeforeRenderers(prefix=topo.prefix))
    assert {c.name for c in await js._jsm.consumers_info(tiles)} == {n.CONSUMER_WORKERS}
    await js.publish(f"{topo.prefix}.tessera.tiles.j1.0", b"old form")
    await js.publish(topo.names.tile_subject("j2", 0), b"tessera")
    await js.publish(topo.names.tile_subject("j3", 0, "povray"), b"povray")
    await ensure_topology(js, topo)
    await assert_topology(js, topo)
    info = await js.stream_info(tiles, subjects_filter=topo.names.tiles_subjects)
    assert set(info.state.subjects or {}) == {
        topo.names.tile_subject("j2", 0),
        topo.names.tile_subject("j3", 0, "povray"),
    }
    assert (await js.consumer_info(tiles, n.CONSUMER_WORKERS)).num_pending == 1
    assert (await js.consumer_info(tiles, n.workers_consumer("povray"))).num_pending == 1
    assert (await js.consumer_info(tiles, n.workers_consumer("blender"))).num_pending == 0


async def test_unchangeable_retention_is_a_config_error(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    name = topo.names.stream(n.STREAM_EVENTS)
    await js.add_stream(name=name, subjects=[topo.names.events_subjects], retention="workqueue")
    with pytest.raises(ConfigError, match=name):
        await ensure_topology(js, topo)


async def test_two_prefixed_topologies_coexist(nc: Client) -> None:
    """The server refuses overlapping stream subjects, so coexistence proves disjointness."""
    js, first, second = nc.jetstream(), fresh(), fresh()
    await asyncio.gather(ensure_topology(js, first), ensure_topology(js, second))
    await assert_topology(js, first)
    await assert_topology(js, second)


async def test_lease_bucket_per_key_ttl(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    await ensure_topology(js, topo)
    kv = await js.key_value(topo.names.bucket(n.BUCKET_LEASES))
    key = n.lease_key_tile(n.new_job_id(), 0)
    first = await kv.create(key, b'{"owner":"a"}', msg_ttl=1)
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.create(key, b'{"owner":"b"}', msg_ttl=1)
    assert (await kv.get(key)).value == b'{"owner":"a"}'

    async def expired_and_retaken() -> bool:
        try:
            second = await kv.create(key, b'{"owner":"b"}', msg_ttl=5)
        except KeyWrongLastSequenceError:
            return False
        return second > first

    await eventually(
        expired_and_retaken, timeout=10, interval=0.1, what="the 1 s lease expires and is retaken"
    )
    assert (await kv.get(key)).value == b'{"owner":"b"}'


async def test_lease_bucket_with_limit_marker_is_repaired(nc: Client) -> None:
    js, topo = nc.jetstream(), fresh()
    bucket = topo.names.bucket(n.BUCKET_LEASES)
    await js.create_key_value(api.KeyValueConfig(bucket=bucket, limit_marker_ttl=5))
    await ensure_topology(js, topo)
    info = await js.stream_info(f"KV_{bucket}")
    assert not info.config.subject_delete_marker_ttl
    assert info.config.allow_msg_ttl is True


async def test_a_service_facing_a_refused_topology_exits_2(
    nc: Client, settings_env: dict[str, str], namespace: str
) -> None:
    """A topology the server will not take is a configuration error: exit 2, said in the log."""
    names = n.Names(namespace)
    name = names.stream(n.STREAM_EVENTS)
    await nc.jetstream().add_stream(
        name=name, subjects=[names.events_subjects], retention="workqueue"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.scheduler",
        env=os.environ | settings_env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2, out
    assert b"start-up failed" in out and name.encode() in out
