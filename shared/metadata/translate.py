"""asyncpg exceptions → Tessera's error tree, in one place.

Nothing above this package sees an asyncpg (or socket) exception. The decision is made on the
exception class and the SQLSTATE class, never on a message:

==========================================  =============================================
raised by asyncpg / the socket              becomes
==========================================  =============================================
``OSError``, ``TimeoutError``               :class:`StoreUnavailable` (refused, reset, DNS,
                                            connect/acquire/command timeout)
SQLSTATE ``08`` connection exception        :class:`StoreUnavailable`
``40`` serialization failure, deadlock      :class:`StoreUnavailable` (after our own retries)
``53`` insufficient resources (too many     :class:`StoreUnavailable`
connections, disk full)
``57P01..3`` shutdown / not yet accepting,  :class:`StoreUnavailable`
``57014`` statement timeout, ``55P03`` lock
timeout, ``25006`` read-only (failover), ``58``
stale prepared statement after a migration, :class:`StoreUnavailable`
asyncpg ``InternalClientError`` (a protocol
state broken by a vanished server), an
``InterfaceError`` on a closed connection or
on one the pool took back when asyncpg
closed it (``base._guarded``)
any other ``PostgresError``, or an          :class:`MetadataError` (terminal: a bug or
``InterfaceError`` on a live connection     corrupt data; the message names SQLSTATE)
==========================================  =============================================
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from shared.core.errors import StoreUnavailable, TerminalError, TesseraError

_RETRYABLE_CLASSES = ("08", "40", "53", "58")
_RETRYABLE_STATES = frozenset({"57P01", "57P02", "57P03", "57014", "55P03", "25006"})
_RETRY_IN_PLACE = frozenset({"40001", "40P01"})
# A prepared statement planned before another service's migration (the next try re-prepares),
# or a connection whose protocol state broke because the server vanished mid-exchange (asyncpg
# reports that as an internal error; the connection is terminated, the pool opens a new one).
_TRANSIENT_CLIENT = (
    asyncpg.exceptions.InvalidCachedStatementError | asyncpg.exceptions.InternalClientError
)


class MetadataError(TerminalError):
    """The metadata store rejected a statement for a reason retrying cannot fix."""

    code = "store_error"


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` (an asyncpg or socket error) may succeed when tried again."""
    if isinstance(exc, _TRANSIENT_CLIENT | OSError | TimeoutError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate or ""
        return state[:2] in _RETRYABLE_CLASSES or state in _RETRYABLE_STATES
    return False


def is_rerunnable(exc: BaseException) -> bool:
    """True for a rolled-back transaction (serialization failure, deadlock) worth rerunning."""
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in _RETRY_IN_PLACE


def translate(exc: Exception, what: str) -> TesseraError:
    """The Tessera error for an exception raised while doing ``what``."""
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, asyncpg.PostgresError):
        detail = f"SQLSTATE {exc.sqlstate} {detail}"
    if is_transient(exc):
        return StoreUnavailable(f"metadata store unavailable during {what}: {detail}")
    return MetadataError(f"metadata store error during {what}: {detail}")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Re-raise anything but our own errors as :func:`translate` says (``from`` the original)."""
    try:
        yield
    except TesseraError:
        raise
    except (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.InternalClientError,
    ) as exc:
        raise translate(exc, what) from exc
    except (OSError, TimeoutError) as exc:
        raise translate(exc, what) from exc
