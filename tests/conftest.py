"""Shared fixtures: real servers for the whole session, fresh namespaces per test.

One :class:`shared.devstack.stack.Stack` (NATS + PostgreSQL, the same supervisor ``tessera up``
uses) is started once per session; SeaweedFS only when a test asks for it. Each test gets its own
NATS namespace (disjoint subjects, streams and buckets), its own database and its own object
directory, so tests never see each other's data.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NATS

from shared.core.config import Settings
from shared.devstack.stack import SeaweedS3, Stack


def _server_dir(prefix: str) -> Iterator[Path]:
    # Not under pytest's basetemp: every pytest start resets /tmp/pytest-of-<user> to 0700,
    # which would lock out PostgreSQL running as its own unprivileged user (as root it must).
    path = Path(tempfile.mkdtemp(prefix=f"tessera-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """NATS with JetStream and PostgreSQL on free loopback ports, for the whole session."""
    for root in _server_dir("stack"):
        with Stack(root, durable=False) as running:
            yield running


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A directory for a test's own servers (PostgreSQL must be able to reach it)."""
    yield from _server_dir("test")


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 server (SeaweedFS), started on first use."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace() -> str:
    """A fresh namespace: every subject, stream and bucket of this test is its own."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def database_url(stack: Stack, namespace: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test, dropped afterwards."""
    admin = await asyncpg.connect(stack.postgres.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{namespace}"')
    finally:
        await admin.close()
    yield stack.postgres.dsn.rsplit("/", 1)[0] + f"/{namespace}"
    admin = await asyncpg.connect(stack.postgres.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{namespace}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
def settings_env(stack: Stack, namespace: str, tmp_path: Path) -> dict[str, str]:
    """Environment for a Tessera process of this test (database not created: see settings)."""
    objects = tmp_path / "objects"
    objects.mkdir()
    return stack.env() | {
        "TESSERA_NAMESPACE": namespace,
        "TESSERA_DATABASE_URL": stack.postgres.dsn.rsplit("/", 1)[0] + f"/{namespace}",
        "TESSERA_OBJECT_STORE": f"file://{objects}",
        "TESSERA_NODE": f"test-{namespace}",
    }


@pytest.fixture
def settings(settings_env: dict[str, str], database_url: str) -> Settings:
    """Settings pointing at this test's namespace, database and object directory."""
    return Settings.from_env(settings_env)


@pytest.fixture
async def nc(stack: Stack) -> AsyncIterator[NATS]:
    """A NATS connection for this test."""
    client = await nats.connect(stack.nats.url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        yield client
    finally:
        await client.close()
