"""Fixtures of the store adapter tests: this test's JetStream topology and bucket names."""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from proto import names as n
from proto.topology import Topology
from shared.nats.ensure import ensure_topology


@pytest.fixture
def topology(namespace: str) -> Topology:
    """This test's topology (short ack_wait so redelivery tests stay fast)."""
    return Topology(prefix=namespace, ack_wait=5.0)


@pytest.fixture
async def js(nc: NATS, topology: Topology) -> JetStreamContext:
    """A JetStream context on the shared server with this test's streams and buckets created."""
    context = nc.jetstream()
    await ensure_topology(context, topology)
    return context


@pytest.fixture
def lease_bucket(topology: Topology) -> str:
    return topology.names.bucket(n.BUCKET_LEASES)


@pytest.fixture
def progress_bucket(topology: Topology) -> str:
    return topology.names.bucket(n.BUCKET_PROGRESS)
