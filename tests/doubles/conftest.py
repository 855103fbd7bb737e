"""The contract fixtures: each double and the real adapter it stands for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NATS

from proto import names as n
from proto.topology import Topology
from shared.devstack.stack import Stack
from shared.metadata import MetadataStore
from shared.nats.ensure import ensure_topology
from shared.nats.leases import Leases, ProgressPointers
from tests.doubles.kv import MemoryBucket, MemoryLeases, MemoryPointers
from tests.doubles.metadata import MemoryMetadata


@dataclass
class KV:
    """Leases and pointers of one implementation, and how to expire a lease on it."""

    leases: Leases
    pointers: ProgressPointers
    kind: str
    expire_bucket: str | None = None
    nc: NATS | None = None

    async def expire(self, key: str) -> None:
        """What the server's TTL does to an owner that stopped renewing: the key is gone."""
        if isinstance(self.leases, MemoryLeases):
            self.leases.expire(key)
            return
        assert self.nc is not None and self.expire_bucket is not None
        kv = await self.nc.jetstream().key_value(self.expire_bucket)
        await kv.delete(key)


@pytest.fixture(params=["memory", "nats"])
async def kv(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[KV]:
    if request.param == "memory":
        leases, pointers = MemoryLeases(10, MemoryBucket()), MemoryPointers(MemoryBucket())
        yield KV(leases, pointers, "memory")  # type: ignore[arg-type]
        return
    stack: Stack = request.getfixturevalue("stack")
    nc = await nats.connect(stack.nats.url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        yield await _nats_kv(nc, namespace)
    finally:
        await nc.close()


async def _nats_kv(nc: NATS, namespace: str) -> KV:
    topology = Topology(prefix=namespace)
    js = nc.jetstream()
    await ensure_topology(js, topology)
    leases_bucket = topology.names.bucket(n.BUCKET_LEASES)
    pointers = ProgressPointers(js, topology.names.bucket(n.BUCKET_PROGRESS))
    return KV(Leases(js, leases_bucket, ttl=10), pointers, "nats", leases_bucket, nc)


Meta = MemoryMetadata | MetadataStore
"""Either implementation of the metadata contract."""


@pytest.fixture(params=["memory", "postgres"])
async def meta(request: pytest.FixtureRequest) -> AsyncIterator[Meta]:
    """The metadata double, or the real store on this test's fresh database."""
    if request.param == "memory":
        yield MemoryMetadata()
        return
    # (``database_url`` is an async fixture, which an async fixture cannot request lazily:
    # the same fresh database, made here.)
    stack: Stack = request.getfixturevalue("stack")
    name: str = request.getfixturevalue("namespace")
    admin = await asyncpg.connect(stack.postgres.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    store = await MetadataStore.connect(stack.postgres.dsn.rsplit("/", 1)[0] + f"/{name}")
    try:
        yield store
    finally:
        await store.close()
        admin = await asyncpg.connect(stack.postgres.dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
