"""The audit trail (``job_events``) and the ``attempts`` table, on a caller's connection.

These helpers run inside the transaction of the state change they record, so a transition and
its audit row commit together or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from asyncpg import Record
from asyncpg.pool import PoolConnectionProxy

from shared.core.errors import ValidationError
from shared.metadata.models import Attempt, AttemptOutcome, AuditEvent

Conn: TypeAlias = "PoolConnectionProxy[Record]"
"""The connection type every helper takes (a pooled asyncpg connection)."""


@dataclass(frozen=True)
class Who:
    """Who caused a change and why: copied into the audit row (and the attempt, if any)."""

    node: str = ""
    attempt_id: str | None = None
    error_code: str | None = None
    error: str | None = None
    detail: str | None = None


async def record_event(
    conn: Conn,
    job_id: str,
    *,
    tile_index: int | None,
    from_state: str | None,
    to_state: str,
    trigger: str,
    who: Who,
) -> None:
    """Append one ``job_events`` row (entity ``tile`` when ``tile_index`` is given)."""
    await conn.execute(
        """
        INSERT INTO job_events (job_id, tile_index, attempt_id, node, entity, from_state,
                                to_state, trigger, error_code, error, detail)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
        """,
        job_id,
        tile_index,
        who.attempt_id,
        who.node,
        "job" if tile_index is None else "tile",
        from_state,
        to_state,
        trigger,
        who.error_code,
        who.error,
        who.detail,
    )


async def record_tile_events(
    conn: Conn,
    job_id: str,
    tile_indexes: list[int],
    *,
    from_state: str,
    to_state: str,
    trigger: str,
    who: Who,
) -> None:
    """Append one ``job_events`` row per tile of a bulk move, in one statement."""
    await conn.execute(
        """
        INSERT INTO job_events (job_id, tile_index, attempt_id, node, entity, from_state,
                                to_state, trigger, error_code, error, detail)
        SELECT $1, i, $3, $4, 'tile', $5, $6, $7, $8, $9, $10 FROM unnest($2::integer[]) AS i
        """,
        job_id,
        tile_indexes,
        who.attempt_id,
        who.node,
        from_state,
        to_state,
        trigger,
        who.error_code,
        who.error,
        who.detail,
    )


async def start_attempt(
    conn: Conn,
    job_id: str,
    tile_index: int | None,
    *,
    attempt_id: str,
    node: str,
    fence: int,
    resumed_from: int = 0,
) -> None:
    """Insert an ``attempts`` row; a second start of the same attempt id changes nothing."""
    await conn.execute(
        """
        INSERT INTO attempts (attempt_id, job_id, tile_index, kind, node, fence, resumed_from)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (attempt_id) DO NOTHING
        """,
        attempt_id,
        job_id,
        tile_index,
        "final" if tile_index is None else "tile",
        node,
        fence,
        resumed_from,
    )


EVENT_COLUMNS = (
    "job_id, tile_index, attempt_id, node, entity, from_state, to_state, trigger, error_code,"
    " error, detail"
)
"""The ``job_events`` columns a combined statement fills, in the order of its values
(:mod:`shared.metadata.fastpath`)."""


ABANDONED = "lease_expired"
"""``last_error_code`` of a tile taken over from owners that stopped renewing their lease."""


async def open_attempts(
    conn: Conn, job_id: str, tile_index: int, *, below: int
) -> list[tuple[str, str]]:
    """``(attempt_id, node)`` of the tile's attempts still open under a fence below ``below``.

    At a takeover these are owners that died, froze or were cut off without settling: the
    new owner's audit row names them, so the trail explains the takeover. Their rows stay open
    for a frozen owner that wakes up to record its own outcome (``fenced``, ``lease_lost``).
    """
    rows = await conn.fetch(
        """
        SELECT attempt_id, node FROM attempts
        WHERE job_id = $1 AND tile_index = $2 AND ended_at IS NULL AND fence < $3
        ORDER BY started_at
        """,
        job_id,
        tile_index,
        below,
    )
    return [(row["attempt_id"], row["node"]) for row in rows]


def outcome_of(value: AttemptOutcome | str) -> AttemptOutcome:
    """``value`` as an :class:`AttemptOutcome`, or :class:`ValidationError` naming the choices."""
    try:
        return AttemptOutcome(value)
    except ValueError:
        choices = ", ".join(o.value for o in AttemptOutcome)
        raise ValidationError(f"attempt outcome {value!r} is not one of {choices}") from None


async def end_attempt(
    conn: Conn,
    attempt_id: str | None,
    outcome: AttemptOutcome | str,
    *,
    error_code: str | None = None,
    error: str | None = None,
) -> None:
    """Close an open attempt; the first outcome recorded wins (a late duplicate is ignored).

    Without an ``attempt_id`` there is nothing to close and ``outcome`` is not checked.
    """
    if attempt_id is None:
        return
    checked = outcome_of(outcome)
    await conn.execute(
        """
        UPDATE attempts SET ended_at = now(), outcome = $2, error_code = $3, error = $4
        WHERE attempt_id = $1 AND ended_at IS NULL
        """,
        attempt_id,
        checked.value,
        error_code,
        error,
    )


async def events_of(conn: Conn, job_id: str) -> list[AuditEvent]:
    """The job's audit trail, oldest first."""
    rows = await conn.fetch("SELECT * FROM job_events WHERE job_id = $1 ORDER BY id", job_id)
    return [AuditEvent.from_record(row) for row in rows]


async def attempts_of(conn: Conn, job_id: str) -> list[Attempt]:
    """The job's attempts in the order they started."""
    rows = await conn.fetch(
        "SELECT * FROM attempts WHERE job_id = $1 ORDER BY started_at, attempt_id", job_id
    )
    return [Attempt.from_record(row) for row in rows]
