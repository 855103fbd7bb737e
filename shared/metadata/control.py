"""Job control on the caller's connection: pause, resume, priority, and handing tiles back.

A paused job's tiles are *unreleased*: ``state = 'queued'`` and ``published_at`` NULL (the
dispatch model of issue 16: a tile is released iff ``published_at`` is set). Every move here is
a compare-and-set like the others: the job row is written first (see
:mod:`shared.metadata.tiles`), a tile move requires the state it read and, for a tile's owner,
``lease_fence = token``; a tile is only handed back while its job is still ``paused``.
"""

from __future__ import annotations

from shared.core.errors import NotFoundError, ValidationError
from shared.core.lifecycle import (
    TERMINAL_JOB_STATES,
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    tile_legal_events,
    transition_tile,
)
from shared.metadata import audit, jobs
from shared.metadata.audit import Conn, Who
from shared.metadata.models import AttemptOutcome, Job, JobControl

__all__ = [
    "PRIORITY_STATES",
    "PRIORITY_TRIGGER",
    "control_of",
    "next_deadline",
    "overdue",
    "pause",
    "resume",
    "set_priority",
    "unrelease_idle",
    "unrelease_tile",
]

PRIORITY_TRIGGER = "priority"
"""The ``trigger`` of the audit row a priority change writes (the job's state is unchanged)."""
PRIORITY_STATES = frozenset(
    {JobState.QUEUED, JobState.RUNNING, JobState.PROGRESSING, JobState.PAUSED}
)
"""Job states whose priority may change (a job not yet finished rendering)."""
#: tiles nobody works on that a pause hands back unreleased (derived from the tile machine)
_IDLE_PAUSABLE = tuple(
    s
    for s in TileState
    if s not in (TileState.LEASED, TileState.PROGRESSING)
    and TileTrigger.PAUSE in tile_legal_events(s)
)
_PAUSABLE = [s.value for s in TileState if TileTrigger.PAUSE in tile_legal_events(s)]


async def pause(conn: Conn, job_id: str, who: Who) -> list[int]:
    """PAUSE the job, then un-release its idle tiles; the tiles handed back.

    A job already paused is a self-loop (nothing written). IllegalTransition for a job whose
    state does not pause (finalizing, or final).
    """
    await jobs.move_job(conn, job_id, JobTrigger.PAUSE, who=who)
    return await unrelease_idle(conn, job_id, who)


async def unrelease_idle(conn: Conn, job_id: str, who: Who) -> list[int]:
    """Released tiles of the job that nobody holds, back to ``queued`` with ``published_at``
    NULL (TileTrigger.PAUSE, audited per tile); the indexes moved."""
    moved: list[int] = []
    for source in _IDLE_PAUSABLE:
        target = transition_tile(source, TileTrigger.PAUSE)
        rows = await conn.fetch(
            """
            UPDATE tiles SET state = $3, published_at = NULL, generation = generation + 1,
                updated_at = now()
            WHERE job_id = $1 AND state = $2
              AND (published_at IS NOT NULL OR state <> $3)
            RETURNING tile_index
            """,
            job_id,
            source.value,
            target.value,
        )
        indexes = sorted(r["tile_index"] for r in rows)
        if indexes:
            await audit.record_tile_events(
                conn,
                job_id,
                indexes,
                from_state=source,
                to_state=target,
                trigger=TileTrigger.PAUSE,
                who=who,
            )
        moved += indexes
    return sorted(moved)


async def unrelease_tile(
    conn: Conn, job_id: str, tile_index: int, *, token: int | None, who: Who
) -> bool:
    """Hand one tile of a paused job back unreleased: queued, ``published_at`` NULL, audited.

    With ``token`` (the lease holder: the owner stopping at a pass boundary, or a worker that
    took the lease of a paused job's tile) the move requires ``lease_fence <= token`` and the
    attempt (if any) ends ``paused``; without it only a tile
    nobody holds moves (a TILES message that arrived for a paused job). False, and nothing
    written, when the job is no longer paused (a resume came first) or the fence is not ours.
    """
    # The job row first (shared: a resume waits for this hand-back, or wins before it).
    job_state = await conn.fetchval("SELECT state FROM jobs WHERE job_id = $1 FOR SHARE", job_id)
    row = await conn.fetchrow(
        """
        SELECT state, lease_fence, published_at FROM tiles
        WHERE job_id = $1 AND tile_index = $2 FOR UPDATE
        """,
        job_id,
        tile_index,
    )
    if job_state is None or row is None:
        raise NotFoundError(f"tile {tile_index} of job {job_id} does not exist")
    state = TileState(row["state"])
    # Our fence, or an older one (we hold the lease now: a dead owner's tile, or a fence
    # refused because the job is paused); without a token, only a tile nobody holds.
    ours = token is None or row["lease_fence"] <= token
    idle = token is not None or state not in (TileState.LEASED, TileState.PROGRESSING)
    if job_state != JobState.PAUSED or not ours or not idle:
        return False
    if state.value not in _PAUSABLE:
        return False  # done, or final: nothing to hand back
    if state is TileState.QUEUED and row["published_at"] is None:
        await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.PAUSED)
        return True  # already unreleased
    target = transition_tile(state, TileTrigger.PAUSE)
    if token is not None and row["lease_fence"] < token:
        # Taken over from owners that stopped renewing (their rows stay open, like at a
        # fence takeover, for an owner that wakes up to record its own outcome).
        abandoned = await audit.open_attempts(conn, job_id, tile_index, below=token)
        if abandoned:
            names = ", ".join(f"{a} on {node}" for a, node in abandoned)
            error = f"handed back for the pause; attempt {names} stopped renewing its lease"
            who = Who(who.node, who.attempt_id, audit.ABANDONED, error)
    await conn.execute(
        """
        UPDATE tiles SET state = $3, published_at = NULL, generation = generation + 1,
            updated_at = now()
        WHERE job_id = $1 AND tile_index = $2
        """,
        job_id,
        tile_index,
        target.value,
    )
    await audit.end_attempt(conn, who.attempt_id, AttemptOutcome.PAUSED)
    await audit.record_event(
        conn,
        job_id,
        tile_index=tile_index,
        from_state=state,
        to_state=target,
        trigger=TileTrigger.PAUSE,
        who=who,
    )
    return True


async def resume(conn: Conn, job_id: str, who: Who) -> None:
    """RESUME a paused job (IllegalTransition naming its state if it is not paused)."""
    await jobs.move_job(conn, job_id, JobTrigger.RESUME, expected=JobState.PAUSED, who=who)


async def set_priority(conn: Conn, job_id: str, priority: int, who: Who) -> Job:
    """Change a not-yet-rendered job's priority, audited (trigger ``priority``); the job."""
    if not 0 <= priority <= 100:
        raise ValidationError(f"priority: {priority} is not between 0 and 100")
    row = await conn.fetchrow(
        "SELECT state, priority FROM jobs WHERE job_id = $1 FOR UPDATE", job_id
    )
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    state = JobState(row["state"])
    if state not in PRIORITY_STATES:
        allowed = ", ".join(sorted(s.value for s in PRIORITY_STATES))
        raise IllegalTransition(
            f"job {job_id}: the priority of a {state.value} job cannot change (only {allowed})"
        )
    if row["priority"] != priority:
        await conn.execute(
            "UPDATE jobs SET priority = $2, updated_at = now() WHERE job_id = $1",
            job_id,
            priority,
        )
        detail = Who(who.node, detail=f"priority {row['priority']} -> {priority}")
        await audit.record_event(
            conn,
            job_id,
            tile_index=None,
            from_state=state,
            to_state=state,
            trigger=PRIORITY_TRIGGER,
            who=detail,
        )
    return await jobs.require_job(conn, job_id)


async def control_of(conn: Conn, job_id: str) -> JobControl:
    """What a worker asks between passes: the job's state, cancel flag and deadline."""
    row = await conn.fetchrow(
        """
        SELECT state, cancel_requested, deadline_at, last_error_code
        FROM jobs WHERE job_id = $1
        """,
        job_id,
    )
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return JobControl(
        state=JobState(row["state"]),
        cancel_requested=bool(row["cancel_requested"]),
        deadline_at=row["deadline_at"],
        last_error_code=row["last_error_code"],
    )


# A literal list, so the planner can match the partial index jobs_deadline's predicate.
_LIVE = ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_JOB_STATES))
_OVERDUE = f"""
SELECT job_id FROM jobs
WHERE deadline_at IS NOT NULL AND deadline_at <= now() AND state NOT IN ({_LIVE})
ORDER BY deadline_at, job_id LIMIT $1
"""


async def overdue(conn: Conn, *, limit: int) -> list[str]:
    """Ids of live jobs past their deadline, earliest first."""
    return [r["job_id"] for r in await conn.fetch(_OVERDUE, limit)]


_NEXT_DEADLINE = f"""
SELECT EXTRACT(EPOCH FROM deadline_at - now())::float8 FROM jobs
WHERE deadline_at IS NOT NULL AND state NOT IN ({_LIVE})
ORDER BY deadline_at LIMIT 1
"""


async def next_deadline(conn: Conn) -> float | None:
    """Seconds from the database's now to the earliest deadline of a live job (negative when it
    has passed); None when no live job has one."""
    value = await conn.fetchval(_NEXT_DEADLINE)
    return None if value is None else float(value)
