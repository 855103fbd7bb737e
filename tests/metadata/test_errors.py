"""Error translation: nothing but Tessera errors leave the store, outages are retryable."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg
import pytest

from shared.core.errors import ConfigError, RetryableError, StoreUnavailable, TerminalError
from shared.devstack.procs import free_port
from shared.devstack.stack import PostgresServer
from shared.metadata import MetadataError, MetadataStore, NewJob
from shared.metadata.audit import Conn
from shared.metadata.translate import translate
from tests.helpers import eventually


async def test_an_unreachable_server_is_store_unavailable() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(StoreUnavailable, match="connect") as caught:
        await MetadataStore.connect(dsn, connect_timeout=2)
    assert isinstance(caught.value.__cause__, OSError)


async def test_a_missing_database_is_terminal(database_url: str) -> None:
    with pytest.raises(MetadataError, match="3D000"):
        await MetadataStore.connect(database_url + "_does_not_exist")


@pytest.mark.parametrize("port", ["99999999", "notaport"])
async def test_a_malformed_dsn_is_a_config_error(port: str) -> None:
    with pytest.raises(ConfigError, match="DSN"):
        await MetadataStore.connect(f"postgresql://postgres@127.0.0.1:{port}/x")


async def test_too_many_connections_is_store_unavailable(database_url: str) -> None:
    # Superusers are exempt from connection limits, so use a limited role of this test.
    role = "r_" + database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(database_url)
    await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
    dsn = database_url.replace("postgres@", f"{role}@", 1)
    first = await MetadataStore.connect(dsn, min_size=1, max_size=1, migrate=False)
    try:
        with pytest.raises(StoreUnavailable, match="53300"):
            await MetadataStore.connect(dsn, migrate=False)
    finally:
        await first.close()
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()


async def test_a_statement_timeout_is_store_unavailable(
    database_url: str, new_job: Callable[..., NewJob]
) -> None:
    store = await MetadataStore.connect(database_url, command_timeout=0.3)
    job_id = (await store.submit_job(new_job())).job.job_id
    blocker = await asyncpg.connect(database_url)
    try:
        async with blocker.transaction():
            await blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StoreUnavailable, match="TimeoutError"):
                await store.get_job(job_id)
        assert (await store.get_job(job_id)) is not None  # the pool recovered
    finally:
        await blocker.close()
        await store.close()


async def test_a_closed_store_is_unavailable(store: MetadataStore) -> None:
    await store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await store.ping()


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.TooManyConnectionsError("too many"),
        asyncpg.exceptions.SerializationError("could not serialize"),
        asyncpg.exceptions.DeadlockDetectedError("deadlock"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        asyncpg.exceptions.CannotConnectNowError("starting up"),
        asyncpg.exceptions.QueryCanceledError("statement timeout"),
        asyncpg.exceptions.ConnectionDoesNotExistError("closed mid-operation"),
        asyncpg.exceptions.ReadOnlySQLTransactionError("read-only"),
        asyncpg.exceptions.InvalidCachedStatementError("cached plan must not change"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError(),
    ],
    ids=type,
)
def test_transient_errors_become_store_unavailable(exc: Exception) -> None:
    assert isinstance(translate(exc, "test"), StoreUnavailable)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.UniqueViolationError("duplicate key"),
        asyncpg.exceptions.UndefinedTableError("no such table"),
        asyncpg.exceptions.InvalidPasswordError("password"),
        asyncpg.exceptions.InterfaceError("another operation is in progress"),
    ],
    ids=type,
)
def test_other_errors_become_terminal(exc: Exception) -> None:
    translated = translate(exc, "test")
    assert isinstance(translated, TerminalError) and not isinstance(translated, RetryableError)
    assert "test" in str(translated)


@pytest.mark.parametrize("transaction", [True, False], ids=["transaction", "statement"])
async def test_a_connection_the_server_drops_mid_use_is_store_unavailable(
    store: MetadataStore, database_url: str, transaction: bool
) -> None:
    """A backend terminated under a statement (as a PostgreSQL shutdown does) is an outage.

    asyncpg closes the connection and the pool takes it back at once, so the transaction's exit
    (and any later call on the proxy) raises "released back to the pool": that is the outage,
    never a terminal error that would fail the job (as it did in a PostgreSQL restart).
    """
    admin = await asyncpg.connect(database_url)
    try:

        async def dropped(conn: Conn) -> object:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            await admin.execute("SELECT pg_terminate_backend($1)", pid)
            return await conn.fetchval("SELECT 1")

        run = store._tx if transaction else store._statement
        with pytest.raises(StoreUnavailable):
            await run("test", dropped)
        await store.ping()  # the pool opened a fresh connection
    finally:
        await admin.close()


@pytest.fixture
async def own_postgres() -> AsyncIterator[PostgresServer]:
    """A private PostgreSQL this test may stop and kill (never the session's).

    Its data lives outside pytest's basetemp: a concurrent pytest run resets
    ``/tmp/pytest-of-<user>`` to mode 0700, which the unprivileged postgres user (when running
    as root) then cannot traverse during initdb.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="tessera-pg-restart-"))
    server = PostgresServer(data_dir, durable=False)
    try:
        await asyncio.to_thread(server.start)
        yield server
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.chaos
async def test_the_store_survives_a_postgres_restart_and_a_crash(
    own_postgres: PostgresServer, new_job: Callable[..., NewJob]
) -> None:
    store = await MetadataStore.connect(own_postgres.dsn, min_size=2, connect_timeout=2)
    try:
        job_id = (await store.submit_job(new_job())).job.job_id
        for outage in (own_postgres.stop, own_postgres.proc.kill):
            await asyncio.to_thread(outage)
            probes = (
                store.ping,
                lambda: store.get_job(job_id),
                lambda: store.submit_job(new_job()),
            )
            for probe in probes:
                with pytest.raises(StoreUnavailable):
                    await probe()
            await asyncio.to_thread(own_postgres.start)
            await eventually(_answers(store), timeout=20, what="store answers after restart")
            job = await store.get_job(job_id)
            assert job is not None and job.job_id == job_id
            assert (await store.submit_job(new_job())).created
    finally:
        await store.close()


def _answers(store: MetadataStore) -> Callable[[], object]:
    async def probe() -> bool:
        try:
            await store.ping()
        except StoreUnavailable:
            return False
        return True

    return probe
