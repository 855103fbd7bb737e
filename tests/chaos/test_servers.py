"""The servers themselves go away mid-render: NATS restarts, PostgreSQL restarts, S3 is down
for seconds. Each test runs its own server (the session ones are shared) and points the
services at it; the job must still end with the reference PNG and every invariant."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from shared.devstack.stack import (
    S3_ACCESS_KEY,
    S3_BUCKET,
    S3_SECRET_KEY,
    NatsServer,
    PostgresServer,
    SeaweedS3,
)
from tests.chaos.conftest import record
from tests.chaos.invariants import check_job, summary_row
from tests.chaos.rig import Rig, open_rig, tiny
from tests.helpers import eventually

pytestmark = pytest.mark.chaos


async def _mid_render(rig: Rig, job_id: str) -> None:
    async def progressing() -> bool:
        return any(t.samples_done > 0 for t in await rig.db.list_tiles(job_id))

    await eventually(
        progressing, timeout=30, what="a tile has checkpointed progress", detail=rig.procs.logs
    )


@pytest.fixture
def own_nats(server_dir: Path) -> Iterator[NatsServer]:
    server = NatsServer(server_dir / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_postgres(server_dir: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(server_dir / "pg", durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_s3(server_dir: Path) -> Iterator[SeaweedS3]:
    server = SeaweedS3(server_dir / "s3")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_nats_restart_mid_render(
    own_nats: NatsServer, chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    body = tiny(spp=2000)
    env = chaos_env | {"TESSERA_NATS_URL": own_nats.url}
    async with open_rig(env, tmp_path / "logs") as rig:
        job_id = await rig.submit(body)
        await _mid_render(rig, job_id)
        own_nats.stop()  # same port and store directory on start: streams and KV survive
        own_nats.start()
        await rig.settle(job_id)
        report = await check_job(rig, job_id, body)
        record(summary_row("NATS restart", [report], rig, time.monotonic() - started))
        report.assert_ok()


async def test_postgres_restart_mid_render(
    own_postgres: PostgresServer, chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    admin = await asyncpg.connect(own_postgres.dsn)
    try:
        await admin.execute('CREATE DATABASE "chaos"')
    finally:
        await admin.close()
    body = tiny(spp=2000)
    env = chaos_env | {"TESSERA_DATABASE_URL": own_postgres.dsn.rsplit("/", 1)[0] + "/chaos"}
    async with open_rig(env, tmp_path / "logs") as rig:
        job_id = await rig.submit(body)
        await _mid_render(rig, job_id)
        own_postgres.stop()
        own_postgres.start()
        await rig.settle(job_id)
        report = await check_job(rig, job_id, body)
        record(summary_row("PostgreSQL restart", [report], rig, time.monotonic() - started))
        report.assert_ok()


async def test_object_store_outage_is_retried(
    own_s3: SeaweedS3, chaos_env: dict[str, str], tmp_path: Path
) -> None:
    started = time.monotonic()
    body = tiny(spp=2000)
    env = chaos_env | {
        "TESSERA_OBJECT_STORE": f"s3://{S3_BUCKET}",
        "TESSERA_S3_ENDPOINT": own_s3.endpoint,
        "TESSERA_S3_ACCESS_KEY": S3_ACCESS_KEY,
        "TESSERA_S3_SECRET_KEY": S3_SECRET_KEY,
        "TESSERA_S3_REGION": "us-east-1",
    }
    async with open_rig(env, tmp_path / "logs") as rig:
        job_id = await rig.submit(body)
        await _mid_render(rig, job_id)
        own_s3.stop()

        def noticed() -> bool:  # the outage is seen (and retried), not merely waited out
            return rig.count_logged("retryable failure") >= 2

        await eventually(
            noticed, timeout=30, what="workers retry through the outage", detail=rig.procs.logs
        )
        own_s3.start()
        await rig.settle(job_id)
        report = await check_job(rig, job_id, body)
        record(summary_row("S3 outage", [report], rig, time.monotonic() - started))
        report.assert_ok()
        assert report.retries >= 1
