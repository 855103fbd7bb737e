"""Migrations: concurrent start-up, one row per version, checksums, schema vs lifecycle."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from shared.core.errors import ConfigError
from shared.core.lifecycle import JobState, TileState
from shared.metadata import MetadataStore
from shared.metadata.migrate import load_migrations
from tests.metadata.conftest import RECTS, make_new_job


async def test_four_services_migrating_at_once_apply_each_version_once(database_url: str) -> None:
    stores = await asyncio.gather(
        *(MetadataStore.connect(database_url, min_size=1, max_size=2) for _ in range(4))
    )
    try:
        versions = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    latest = len(load_migrations())
    assert versions == [latest] * 4
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT version, count(*) AS n FROM schema_migrations GROUP BY 1")
    finally:
        await conn.close()
    assert sorted((r["version"], r["n"]) for r in rows) == [(v, 1) for v in range(1, latest + 1)]


async def test_migrate_is_idempotent(store: MetadataStore) -> None:
    assert await store.migrate() == await store.migrate() == len(load_migrations())


async def test_an_edited_applied_migration_is_refused(database_url: str) -> None:
    store = await MetadataStore.connect(database_url)
    try:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("UPDATE schema_migrations SET sha256 = 'x' WHERE version = 1")
        finally:
            await conn.close()
        with pytest.raises(ConfigError, match="changed after it was applied"):
            await store.migrate()
    finally:
        await store.close()


@pytest.mark.parametrize(("table", "states"), [("jobs", JobState), ("tiles", TileState)])
async def test_state_checks_match_the_lifecycle_enums(
    database_url: str, table: str, states: type[JobState] | type[TileState]
) -> None:
    store = await MetadataStore.connect(database_url)
    await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        definition = await conn.fetchval(
            """
            SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
            WHERE c.conrelid = $1::regclass AND c.contype = 'c'
              AND pg_get_constraintdef(c.oid) LIKE '%state%'
            """,
            table,
        )
    finally:
        await conn.close()
    allowed = {part.split("'")[1] for part in definition.split("ARRAY[")[1].split(",")}
    assert allowed == {s.value for s in states}


async def test_audit_and_attempt_rows_reference_their_tile_or_job(
    store: MetadataStore, database_url: str
) -> None:
    """Version 9 moved the foreign keys of a tile's audit and attempt rows from the job's row
    to the tile's: a row naming a tile or job that does not exist is still refused, and
    deleting a job still deletes every row of it."""
    job_id = (await store.submit_job(make_new_job())).job.job_id
    await store.plan_tiles(job_id, RECTS, node="sched")
    conn = await asyncpg.connect(database_url)
    event = (
        "INSERT INTO job_events (job_id, tile_index, node, entity, to_state, trigger)"
        " VALUES ($1, $2, 'n', $3, 'queued', 'test')"
    )
    attempt = "INSERT INTO attempts (attempt_id, job_id, tile_index, kind) VALUES ($1, $2, $3, $4)"
    try:
        await conn.execute(event, job_id, 3, "tile")
        await conn.execute(event, job_id, None, "job")
        await conn.execute(attempt, "a-tile", job_id, 3, "tile")
        await conn.execute(attempt, "a-final", job_id, None, "final")
        for sql, args in [
            (event, (job_id, 4, "tile")),  # no tile 4
            (event, ("no-such-job", 0, "tile")),
            (event, ("no-such-job", None, "job")),
            (attempt, ("b-tile", job_id, 4, "tile")),
            (attempt, ("b-final", "no-such-job", None, "final")),
        ]:
            with pytest.raises(asyncpg.ForeignKeyViolationError):
                await conn.execute(sql, *args)
        assert await conn.fetchval("SELECT count(*) FROM job_events WHERE job_id = $1", job_id)
        await conn.execute("DELETE FROM jobs WHERE job_id = $1", job_id)
        for table in ("job_events", "attempts", "tiles"):
            left = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE job_id = $1", job_id)
            assert left == 0, table
    finally:
        await conn.close()
