"""Migrations: concurrent start-up, one row per version, checksums, schema vs lifecycle."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from shared.core.errors import ConfigError
from shared.core.lifecycle import JobState, TileState
from shared.metadata import MetadataStore
from shared.metadata.migrate import load_migrations


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
