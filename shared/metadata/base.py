"""The pool, the transaction runner and error translation under :class:`MetadataStore`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Self, TypeVar

import asyncpg
import orjson
from asyncpg import Record

from shared.core.errors import ConfigError, StoreUnavailable
from shared.metadata.audit import Conn
from shared.metadata.jobs import CasMiss
from shared.metadata.migrate import apply_migrations, load_migrations
from shared.metadata.translate import is_rerunnable, translated

T = TypeVar("T")

#: a transaction whose compare-and-set keeps losing is rerun at most this often
TX_ATTEMPTS = 8
#: bound on waiting for the pool to be released in :meth:`StoreBase.close`
CLOSE_TIMEOUT = 10.0


def _encode_jsonb(value: Any) -> bytes:
    return b"\x01" + orjson.dumps(value)  # binary jsonb: a version byte, then JSON text


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(data[1:])


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Pool release hook: nothing to reset.

    The store keeps no session state (no ``SET``, ``LISTEN``, cursors or session advisory locks;
    the migration lock is transaction-scoped), and asyncpg rolls back an open transaction on
    release anyway, so asyncpg's default reset query would be one wasted round trip per use.
    """


async def _init_connection(conn: asyncpg.Connection[Record]) -> None:
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        format="binary",
    )


class StoreBase:
    """Owns the asyncpg pool; every query runs through :meth:`_tx` or :meth:`_read`."""

    def __init__(self, pool: asyncpg.Pool[Record], *, acquire_timeout: float) -> None:
        self._pool = pool
        self._acquire_timeout = acquire_timeout
        self._closed = False

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        acquire_timeout: float = 30.0,
        migrate: bool = True,
        generic_plans: bool = False,
    ) -> Self:
        """Create the pool and (unless ``migrate=False``) apply pending migrations.

        Raises :class:`StoreUnavailable` when the server cannot be reached within
        ``connect_timeout``; ``command_timeout`` bounds every statement and
        ``acquire_timeout`` the wait for a free pooled connection. ``generic_plans``: the
        pool's connections plan each prepared statement once (``plan_cache_mode =
        force_generic_plan``). Under the default (``auto``) PostgreSQL plans a statement whose
        parameters are arrays again at every call: a generic plan assumes 10 elements per
        ``= ANY($1)`` array and 100 rows per ``unnest``, and loses to the custom plan of the
        usual one to a few, so the worker's fence, commit and completion question paid 0.2-0.55
        ms of planning per call, as much as their execution. Only for a caller whose
        statements are all keyed lookups and writes (the worker's), whose plan does not depend
        on the values; a statement over a time window of a large table (the scheduler's fair
        share, the console's) keeps ``auto``, which plans for the window's actual width.

        A plan made once is made on the statistics of that moment, which may be those of an
        empty table (a fresh deployment, the first job): a sequential scan of a table that
        looked one page long would then stay the plan while the table grows. So these
        connections also run without sequential scans, hash joins and merge joins
        (``enable_seqscan``, ``enable_hashjoin``, ``enable_mergejoin`` off): every lookup they
        make has its key's index, and every join is a nested loop over a batch's few rows
        into that index, which the planner then takes whatever the tables looked like.
        """
        settings = {"application_name": "tessera"}
        if generic_plans:
            settings["plan_cache_mode"] = "force_generic_plan"
            for method in ("seqscan", "hashjoin", "mergejoin"):
                settings[f"enable_{method}"] = "off"
        with translated("connect"):
            try:
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=min_size,
                    max_size=max_size,
                    command_timeout=command_timeout,
                    timeout=connect_timeout,
                    init=_init_connection,
                    reset=_reset_connection,
                    server_settings=settings,
                )
            except (ValueError, OverflowError) as exc:  # ClientConfigurationError; port > 65535
                raise ConfigError(f"TESSERA_DATABASE_URL is not a usable DSN: {exc}") from exc
        store = cls(pool, acquire_timeout=acquire_timeout)
        if migrate:
            try:
                await store.migrate()
            except BaseException:
                await store.close()
                raise
        return store

    async def migrate(self) -> int:
        """Apply pending migrations under the advisory lock; the schema version (idempotent)."""
        migrations = load_migrations()
        return await self._read("migrate", lambda conn: apply_migrations(conn, migrations))

    async def close(self) -> None:
        """Close the pool (waits up to ``CLOSE_TIMEOUT`` for borrowed connections, then cuts)."""
        if self._closed:
            return
        self._closed = True
        try:
            with translated("close"):
                await asyncio.wait_for(self._pool.close(), CLOSE_TIMEOUT)
        except StoreUnavailable:
            self._pool.terminate()

    async def ping(self) -> None:
        """One round trip (``SELECT 1``); :class:`StoreUnavailable` if the store is not there."""
        await self._read("ping", lambda conn: conn.fetchval("SELECT 1"))

    async def _read(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn`` on a pooled connection outside an explicit transaction."""
        self._check_open(what)
        with translated(what):
            async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                return await _guarded(conn, fn, transaction=False)

    async def _statement(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T | None:
        """Run ``fn`` (one statement, atomic on its own) outside an explicit transaction.

        For the one-statement fast paths: a deadlock or serialization failure gives ``None``,
        so the caller falls back to its transaction, which reruns such losses itself.
        """
        self._check_open(what)
        with translated(what):
            async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                try:
                    return await _guarded(conn, fn, transaction=False)
                except asyncpg.PostgresError as exc:
                    if not is_rerunnable(exc):
                        raise
                    return None

    async def _tx(self, what: str, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``fn`` in one transaction; rerun it on a CAS miss, deadlock or serialization failure.

        ``fn`` must decide everything from what it reads in the transaction, so a rerun makes
        the decision again from fresh rows.
        """
        self._check_open(what)
        last: BaseException | None = None
        with translated(what):
            for _ in range(TX_ATTEMPTS):
                try:
                    async with self._pool.acquire(timeout=self._acquire_timeout) as conn:
                        return await _guarded(conn, fn, transaction=True)
                except CasMiss as exc:
                    last = exc
                except asyncpg.PostgresError as exc:
                    if not is_rerunnable(exc):
                        raise
                    last = exc
        raise StoreUnavailable(
            f"metadata store: {what} lost {TX_ATTEMPTS} races in a row; try again later"
        ) from last

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreUnavailable(f"metadata store is closed (during {what})")


async def _guarded(conn: Conn, fn: Callable[[Conn], Awaitable[T]], *, transaction: bool) -> T:
    """Run ``fn``; a connection whose protocol broke (the server vanished under it) is dropped.

    asyncpg can notice a dead server as an internal protocol error, or as "connection is
    closed" while rolling back; either way this connection is unusable: terminate it so the
    pool opens a fresh one (asyncpg does the same when the reset on release fails).

    When the server drops the connection (a shutdown terminates its backend), asyncpg cleans
    it up at once: the pool takes it back and detaches the proxy, so the transaction's rollback
    and every later call on the proxy, ``is_closed()`` included, raise "released back to the
    pool" (asyncpg's own terminate, after a cancel request that found no server, does the
    same). Inside the ``acquire`` that can only mean the connection was closed under us, so it
    is a broken connection too (``tests/metadata/test_errors.py``, a backend terminated mid-use).
    """
    try:
        if not transaction:
            return await fn(conn)
        async with conn.transaction():
            return await fn(conn)
    except (asyncpg.exceptions.InternalClientError, asyncpg.InterfaceError) as exc:
        try:
            closed = conn.is_closed()
        except asyncpg.InterfaceError:  # detached: asyncpg closed it and the pool took it back
            raise StoreUnavailable(
                f"metadata store connection was closed under a statement: {exc}"
            ) from exc
        if isinstance(exc, asyncpg.InterfaceError) and not closed:
            raise  # a misuse on a live connection: a bug, translated as terminal
        conn.terminate()
        raise StoreUnavailable(
            f"metadata store connection broke: {type(exc).__name__}: {exc}"
        ) from exc
