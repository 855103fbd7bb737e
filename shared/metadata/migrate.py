"""Versioned SQL migrations, applied at start-up under a transaction-scoped advisory lock.

Migrations are the files ``migrations/NNNN_name.sql``, applied in version order. Every service
runs :func:`apply_migrations` when it connects; all of them take the same
``pg_advisory_xact_lock`` first, so when four services start together one applies the pending
files and the others wait, then find nothing to do. The pending files and their
``schema_migrations`` rows are written in one transaction (PostgreSQL DDL is transactional):
a crash mid-migration leaves the previous version, never half of one.

``schema_migrations`` records each version once with the sha256 of its file; a file that
changed after it was applied is a :class:`~shared.core.errors.ConfigError` (add a new migration
instead). A database newer than this code (a rolling upgrade) is accepted as it is.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from asyncpg import Record
from asyncpg.pool import PoolConnectionProxy

from shared.core.errors import ConfigError

#: ``pg_advisory_xact_lock`` key of schema migrations (ASCII "tessera\0"); one per database
MIGRATION_LOCK_KEY = 0x7465737365726100
#: bound on waiting for another process's migration (DDL can be slow on big tables)
MIGRATION_TIMEOUT = 120.0

_FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer     PRIMARY KEY,
    name        text        NOT NULL,
    sha256      text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        """Checksum recorded when applied."""
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The packaged migrations in version order (versions must be 1, 2, 3, ... with no gap)."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_RE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise ConfigError(f"migrations are not numbered 1..n: {[m.version for m in found]}")
    return found


async def apply_migrations(conn: PoolConnectionProxy[Record], migrations: list[Migration]) -> int:
    """Apply what is pending in one transaction under the advisory lock; the schema version."""
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY, timeout=MIGRATION_TIMEOUT
        )
        await conn.execute(_CREATE_TABLE)
        rows = await conn.fetch("SELECT version, sha256 FROM schema_migrations")
        applied = {row["version"]: row["sha256"] for row in rows}
        for migration in migrations:
            if migration.version in applied:
                _check_unchanged(migration, applied[migration.version])
                continue
            await conn.execute(migration.sql, timeout=MIGRATION_TIMEOUT)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.sha256,
            )
            applied[migration.version] = migration.sha256
        return max(applied, default=0)


def _check_unchanged(migration: Migration, recorded: str) -> None:
    if recorded != migration.sha256:
        raise ConfigError(
            f"migration {migration.version:04d}_{migration.name}.sql changed after it was "
            "applied to this database; never edit an applied migration, add a new one"
        )
