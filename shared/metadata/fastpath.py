"""The owner's two hot writes, one statement each: the lease fence and the fenced commit.

Each statement writes the tile's side of its move in one round trip, atomic on its own: the
tile row's compare-and-set, the attempt row and the audit row (and the commit's inline result).
They are the only code that writes these rows, and there are two owners of the cases:

- the statement alone (:func:`fence`, :func:`commit`) owns the case every tile of a running job
  goes through: a tile never leased before (no takeover to explain, no checkpoint to resume) of
  a job in a state where TILE_STARTED / TILE_PROGRESS write nothing, fenced under the caller's
  token. Its guards are the lifecycle tables, passed as parameters (never states written in
  SQL), so anything else matches no row: it declines having written nothing, and the caller
  runs the transaction. The fence needs no read before it: it returns the tile row as it was,
  fenced or not, so the worker decides from that row what a declined copy needs;
- the transaction (:mod:`shared.metadata.fencing`) owns every other case: it reads fresh rows,
  refuses, moves the job, names the attempts a takeover supersedes, and then runs the same
  statement (:func:`write_lease`, :func:`write_commit`) guarded by exactly what it read.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncpg import Record

from shared.core.lifecycle import (
    IllegalTransition,
    JobState,
    JobTrigger,
    TileState,
    TileTrigger,
    is_terminal,
    transition_job,
    transition_tile,
)
from shared.metadata.audit import EVENT_COLUMNS, Conn
from shared.metadata.models import FirstFence, Tile, TileCommit, TileFence


def quiet_job_states(trigger: JobTrigger) -> list[JobState]:
    """Live job states that ``trigger`` leaves unchanged (no job row to write)."""
    quiet = []
    for state in JobState:
        try:
            if not is_terminal(state) and transition_job(state, trigger) == state:
                quiet.append(state)
        except IllegalTransition:
            continue
    return quiet


def _moves(trigger: TileTrigger) -> list[tuple[TileState, TileState]]:
    """``(from, to)`` of every tile state ``trigger`` is legal in."""
    moves = []
    for state in TileState:
        try:
            moves.append((state, transition_tile(state, trigger)))
        except IllegalTransition:
            continue
    return moves


_STARTED_QUIET = quiet_job_states(JobTrigger.TILE_STARTED)
_PROGRESS_QUIET = quiet_job_states(JobTrigger.TILE_PROGRESS)
_COMMIT_MOVES = _moves(TileTrigger.COMMIT)
_LEASE_MOVES = _moves(TileTrigger.LEASE)

#: no generation bound (the transaction decides from the rows it read, the generation aside)
ANY_GENERATION = 2**31 - 1

# ``cur`` is the row as the statement's snapshot has it; the update re-checks ``t.state =
# cur.state`` on the row it locks, so a tile that moved meanwhile (READ COMMITTED re-reads a row
# updated under it) matches nothing, and the audit row's from-state is the one it moved from.
_LEASE = f"""
WITH cur AS (
    SELECT * FROM tiles WHERE job_id = $1 AND tile_index = $2
), moved AS (
    UPDATE tiles t SET lease_fence = $3,
        state = ($6::text[])[array_position($5::text[], cur.state)], samples_done = $7,
        attempt_count = t.attempt_count + 1, updated_at = now(),
        last_error_code = COALESCE($12::text, t.last_error_code),
        last_error = COALESCE($13::text, t.last_error)
    FROM cur, jobs j
    WHERE t.job_id = $1 AND t.tile_index = $2 AND t.state = cur.state
      AND cur.state = ANY($5::text[]) AND t.lease_fence < $3
      AND t.attempt_count = $14 AND t.generation <= $15
      AND j.job_id = t.job_id AND j.state = ANY($8::text[]) AND NOT j.cancel_requested
    RETURNING cur.state AS from_state, t.state AS to_state
), started AS (
    INSERT INTO attempts (attempt_id, job_id, tile_index, kind, node, fence, resumed_from)
    SELECT $4, $1, $2, 'tile', $9, $3, $7 FROM moved
    ON CONFLICT (attempt_id) DO NOTHING
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT $1, $2, $4, $9, 'tile', from_state, to_state, $10, $12, $13, $11 FROM moved
)
SELECT (SELECT count(*) FROM moved) AS fenced, cur.* FROM cur
"""

_COMMIT = f"""
WITH cur AS (
    SELECT t.state FROM tiles t JOIN jobs j ON j.job_id = t.job_id
    WHERE t.job_id = $1 AND t.tile_index = $2 AND t.lease_fence = $3
      AND t.state = ANY($9::text[]) AND j.state = ANY($11::text[])
    FOR UPDATE OF t
), moved AS (
    UPDATE tiles t SET state = ($10::text[])[array_position($9::text[], cur.state)],
        result_key = $5, result_sha256 = $6, samples_done = $7,
        last_error_code = NULL, last_error = NULL, updated_at = now()
    FROM cur
    WHERE t.job_id = $1 AND t.tile_index = $2
    RETURNING cur.state AS from_state, t.state AS to_state
), ended AS (
    UPDATE attempts SET ended_at = now(), outcome = 'done'
    WHERE attempt_id = $4 AND ended_at IS NULL AND EXISTS (SELECT 1 FROM moved)
), audited AS (
    INSERT INTO job_events ({EVENT_COLUMNS})
    SELECT $1, $2, $4, $12, 'tile', from_state, to_state, $13, NULL, NULL, NULL FROM moved
), stored AS (
    INSERT INTO tile_results (job_id, tile_index, sha256, data)
    SELECT $1, $2, $6, $8::bytea FROM moved WHERE $8::bytea IS NOT NULL
    ON CONFLICT (job_id, tile_index) DO UPDATE SET sha256 = EXCLUDED.sha256, data = EXCLUDED.data
)
SELECT count(*) FROM moved
"""


async def fence(conn: Conn, lease: TileFence, generation: int) -> FirstFence:
    """Fence a never-leased tile in one statement, for a message of ``generation`` or newer.

    Fenced only in the plain case (never leased, LEASE legal from its state, the fence below the
    token, the message not older than the row's, the job in a state TILE_STARTED leaves as it
    is and not cancel-requested); else nothing is written. Either way the tile row as it was
    just before comes back (``None``: no such tile), for the caller to decide on.
    """
    row = await _lease_row(conn, lease, _LEASE_MOVES, attempts=0, job_states=_STARTED_QUIET,
                           generation=generation)  # fmt: skip
    if row is None:
        return FirstFence(False, None)
    return FirstFence(bool(row["fenced"]), Tile.from_record(row))


async def commit(conn: Conn, done: TileCommit) -> bool | None:
    """True if the statement alone committed the tile; None (nothing written): run the
    transaction."""
    return True if await write_commit(conn, done, _COMMIT_MOVES, _PROGRESS_QUIET) else None


async def write_lease(
    conn: Conn,
    lease: TileFence,
    state: TileState,
    *,
    attempts: int,
    job_states: Sequence[JobState],
    error_code: str | None = None,
    error: str | None = None,
) -> bool:
    """LEASE the tile from ``state`` (after ``attempts`` attempts) for ``lease.token``, its job
    in one of ``job_states`` and not cancel-requested; record the attempt and the audit row.

    ``error_code``/``error`` (a takeover's superseded owners) go on the audit row and become
    the tile's last error. False: no row matched, nothing was written.
    """
    move = [(state, transition_tile(state, TileTrigger.LEASE))]
    row = await _lease_row(
        conn, lease, move, attempts=attempts, job_states=job_states, generation=ANY_GENERATION,
        error_code=error_code, error=error,
    )  # fmt: skip
    return row is not None and bool(row["fenced"])


async def _lease_row(
    conn: Conn,
    lease: TileFence,
    moves: Sequence[tuple[TileState, TileState]],
    *,
    attempts: int,
    job_states: Sequence[JobState],
    generation: int,
    error_code: str | None = None,
    error: str | None = None,
) -> Record | None:
    return await conn.fetchrow(
        _LEASE,
        lease.job_id,
        lease.tile_index,
        lease.token,
        lease.attempt_id,
        [a.value for a, _ in moves],
        [b.value for _, b in moves],
        lease.resumed_from,
        [s.value for s in job_states],
        lease.node,
        TileTrigger.LEASE.value,
        f"fence {lease.token}",
        error_code,
        error,
        attempts,
        generation,
    )


async def write_commit(
    conn: Conn,
    done: TileCommit,
    moves: Sequence[tuple[TileState, TileState]],
    job_states: Sequence[JobState],
) -> bool:
    """COMMIT the tile by one of ``moves`` (``(from, to)``) under ``done.token``, its job in one
    of ``job_states``: the result columns, the attempt closed as done, the audit row and an
    inline result. False: no row matched, nothing was written."""
    moved = await conn.fetchval(
        _COMMIT,
        done.job_id,
        done.tile_index,
        done.token,
        done.attempt_id,
        done.result_key,
        done.result_sha256,
        done.samples_done,
        done.result_data,
        [a.value for a, _ in moves],
        [b.value for _, b in moves],
        [s.value for s in job_states],
        done.node,
        TileTrigger.COMMIT.value,
    )
    return bool(moved)
